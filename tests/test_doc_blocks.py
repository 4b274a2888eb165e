"""Every ```python block of README.md and docs/*.md runs, so a documented call cannot break
unnoticed.

Each block runs in a fresh namespace, in a temporary working folder, as a reader would paste it.
An HTML comment on the line just before a block's fence changes that (it does not render):

* ``<!-- needs: WHAT -->``: the block needs what a unit test has not (``stack``: Kafka, MLflow;
  ``spark``: a Spark session; ``gpu``; ``s3``): it is compiled, not run, and reported skipped
  with that reason. Nothing else skips a block.
* ``<!-- given: CODE -->``: CODE runs first, for names the text around the block defined (an
  excerpt of ``pipelines/ratings.py`` is given that module's imports).

Placeholders: ``/path/to/handoff/ctr`` and ``s3://bucket/handoff/ctr`` stand for a handoff
location; a block runs with a local one holding channels ``backfill`` and ``live`` (columns
``label``, ``dense``, ``sparse``; closed, so followers end).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from flow.handoff import write_table
from tests.support import REPO

PLACEHOLDERS = ("/path/to/handoff/ctr", "s3://bucket/handoff/ctr")
_FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
_MARK = re.compile(r"<!--\s*(needs|given):\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    file: str
    line: int
    code: str
    needs: str | None
    given: str | None

    @property
    def name(self) -> str:
        return f"{self.file}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = path.read_text()
        for match in _FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            before = text[: match.start()].rstrip("\n").rpartition("\n")[2]
            mark = _MARK.search(before)
            kind, value = (mark.group(1), mark.group(2)) if mark else (None, None)
            found.append(
                Block(
                    path.relative_to(REPO).as_posix(),
                    line,
                    match.group(1),
                    value if kind == "needs" else None,
                    value if kind == "given" else None,
                )
            )
    return found


BLOCKS = blocks()


@pytest.fixture(scope="module")
def handoff(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A location with channels ``backfill`` and ``live``, as a pipeline would leave them."""
    root = str(tmp_path_factory.mktemp("doc-handoff"))
    rng = np.random.default_rng(0)
    rows = 64
    table = pa.table(
        {
            "label": rng.integers(0, 2, rows).astype(np.float32),
            "dense": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.random(rows * 3, dtype=np.float32)), 3
            ),
            "sparse": pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(0, 10, rows * 2)), 2),
        }
    )
    for channel in ("backfill", "live"):
        write_table(root, channel, table, num_buckets=2, close=True)
    return root


def test_the_docs_have_python_blocks_and_marks_that_parse() -> None:
    assert len(BLOCKS) >= 10
    for path in [REPO / "README.md", *(REPO / "docs").glob("*.md")]:
        for comment in re.findall(r"<!--\s*(?:needs|given)\b.*?-->", path.read_text()):
            assert _MARK.search(comment), f"{path.name}: malformed mark {comment!r}"


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.name)
def test_the_block_runs(
    block: Block, handoff: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compile(block.code, block.name, "exec")  # every block at least parses
    if block.needs is not None:
        pytest.skip(f"needs {block.needs}")
    source = block.code
    for placeholder in PLACEHOLDERS:
        source = source.replace(placeholder, handoff)
    code = compile(source, block.name, "exec")
    monkeypatch.chdir(tmp_path)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    namespace: dict[str, object] = {"__name__": "doc_block"}
    if block.given is not None:
        exec(compile(block.given, f"{block.name} (given)", "exec"), namespace)
    exec(code, namespace)
