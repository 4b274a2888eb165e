"""The import rules of DESIGN.md, checked on the code as it is.

Package-level contracts (flow imports no engine; spark_jobs and trainers are independent) are
import-linter contracts in pyproject.toml, run by `make checks`. What import-linter cannot see is
checked here: that importing any `flow` module loads neither pyspark nor torch, and that each
engine package stays on its own side of the handoff.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import flow
from tests.support import REPO

HEAVY = ("pyspark", "torch", "delta", "spark_jobs", "trainers", "pipelines")


def _modules(package: str) -> list[str]:
    """Every module of ``package`` but ``__main__`` (which runs the CLI when imported)."""
    names = []
    for path in sorted((REPO / package).rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_importing_every_flow_module_loads_no_engine() -> None:
    modules = _modules("flow")
    assert "flow.cli" in modules
    assert "flow.stack.broker" in modules
    probe = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == []


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("spark_jobs", {"trainers", "torch"}),
        ("trainers", {"spark_jobs", "pyspark", "delta"}),
        ("pipelines", {"spark_jobs", "trainers", "pyspark", "torch"}),
    ],
)
def test_each_side_stays_on_its_side_of_the_handoff(package: str, forbidden: set[str]) -> None:
    offenders = {
        str(path.relative_to(REPO)): sorted(_imported_roots(path) & forbidden)
        for path in (REPO / package).rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_flow_is_the_package_it_claims_to_be() -> None:
    assert Path(flow.__file__).resolve().parent == REPO / "flow"
