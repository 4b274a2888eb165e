"""The timed read loop, command line and result line that every baseline script shares.

Imported by the baseline scripts inside their own venvs (``python -m baselines.<name>_read`` with
``PYTHONPATH`` set to ``benchmarks/``), so it needs nothing but the standard library and torch, and
never the project's ``flow`` package.

What is timed, the same way for every reader:

* ``first_batch_s``: from just before the reader is created to the first batch in hand, which is
  what a trainer waits for at start-up (metadata listing, worker start, first read).
* ``--warmup-batches`` batches (the first one included) are then read and not counted.
* ``seconds`` runs from the end of warm-up to the end of the data; ``rows`` are the rows read in
  that span and ``rows_per_s`` their rate. ``total_rows`` counts everything read, warm-up included,
  so a caller can check the whole dataset came through exactly once.
* ``wall_s`` runs from reader creation to the end, everything included; on small data much of
  the file reading can happen during warm-up (the readers read ahead), so ``rows_per_s`` then
  shows how fast batches are handed over, and ``total_rows / wall_s`` what an epoch costs.

With ``--stack`` each batch's per-column tensors are also stacked into the blocks a trainer feeds
its model (``dense`` [B, 13] float32, ``sparse`` [B, 26] int64), inside the timed loop, because
our reader hands those blocks over ready-made.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

__all__ = [
    "DENSE_COLUMNS",
    "SPARSE_COLUMNS",
    "Batch",
    "Measurement",
    "TreeMemory",
    "build_parser",
    "claim_stdout",
    "emit",
    "measure",
    "set_torch_threads",
    "shuffle_buffer_rows",
    "stack_batch",
]

DENSE_COLUMNS = tuple(f"d{i}" for i in range(13))
SPARSE_COLUMNS = tuple(f"c{i}" for i in range(26))

Batch = Mapping[str, torch.Tensor]


def build_parser(description: str) -> argparse.ArgumentParser:
    """The flags every baseline script takes; a script adds its reader's own knobs."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--parquet", type=Path, required=True, help="folder of .parquet files")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--shuffle", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument(
        "--shuffle-buffer-rows",
        type=int,
        default=None,
        help="rows held for the local shuffle (default: 4 batches)",
    )
    parser.add_argument(
        "--stack",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="stack columns into dense [B,13] / sparse [B,26] blocks inside the timed loop",
    )
    parser.add_argument("--warmup-batches", type=int, default=20)
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads in the reading process (0: torch's default, one per core)",
    )
    return parser


def set_torch_threads(threads: int) -> None:
    """One intra-op thread by default: the loop's torch work is small copies (shuffle gathers,
    stacks), and on 2 cores a second OpenMP thread only spins against the reader's own threads
    (Petastorm's shuffled thread-pool path ran ~10x slower with torch's default of 2)."""
    if threads < 0:
        raise SystemExit(f"--torch-threads must be >= 0, got {threads}")
    if threads:
        torch.set_num_threads(threads)


def shuffle_buffer_rows(args: argparse.Namespace) -> int:
    """Rows in the shuffle buffer: the flag, else four batches (a common local-shuffle size)."""
    rows = args.shuffle_buffer_rows if args.shuffle_buffer_rows is not None else 4 * args.batch_size
    if rows < 1:
        raise SystemExit(f"--shuffle-buffer-rows must be >= 1, got {rows}")
    return int(rows)


def stack_batch(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(label [B], dense [B,13] float32, sparse [B,26] int64)`` from per-column tensors."""
    dense = torch.stack([batch[name] for name in DENSE_COLUMNS], dim=1)
    sparse = torch.stack([batch[name] for name in SPARSE_COLUMNS], dim=1)
    if dense.dtype != torch.float32 or sparse.dtype != torch.int64:
        raise TypeError(
            f"expected float32 dense / int64 sparse columns, got {dense.dtype} / {sparse.dtype}: "
            "write d* as float32 and c* as int64"
        )
    return batch["label"], dense, sparse


def batch_rows(batch: Batch) -> int:
    return int(batch["label"].shape[0])


@dataclass
class Measurement:
    """One read of the dataset; the fields are the result line's, see the module docstring."""

    rows: int
    seconds: float
    first_batch_s: float
    total_rows: int
    batches: int
    wall_s: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def measure(
    open_batches: Callable[[], Iterable[Batch]], *, warmup_batches: int, stack: bool
) -> Measurement:
    """Read every batch ``open_batches()`` yields once, timed as the module docstring says.

    ``open_batches`` creates the reader, so its set-up is inside ``first_batch_s``.
    """
    if warmup_batches < 1:
        raise SystemExit(f"--warmup-batches must be >= 1 (the first batch), got {warmup_batches}")
    handle = _consume_one if not stack else _stack_one
    started = time.perf_counter()
    batches: Iterator[Batch] = iter(open_batches())
    total_rows, count = 0, 0
    first_batch_s = 0.0
    for batch in batches:
        total_rows += handle(batch)
        count += 1
        if count == 1:
            first_batch_s = time.perf_counter() - started
        if count == warmup_batches:
            break
    timed_from, timed_rows = time.perf_counter(), 0
    for batch in batches:
        timed_rows += handle(batch)
        count += 1
    ended = time.perf_counter()
    seconds = ended - timed_from
    if timed_rows == 0:
        raise SystemExit(
            f"all {count} batches ({total_rows} rows) went to warm-up: "
            "lower --warmup-batches or write more rows"
        )
    return Measurement(
        timed_rows, seconds, first_batch_s, total_rows + timed_rows, count, ended - started
    )


def _consume_one(batch: Batch) -> int:
    return batch_rows(batch)


def _stack_one(batch: Batch) -> int:
    label, _dense, _sparse = stack_batch(batch)
    return int(label.shape[0])


@dataclass
class TreeMemory:
    """Peak PSS of this process and all its descendants, sampled in a background thread.

    ``getrusage`` sees only this process, while Petastorm's process pool and all of Ray (raylet,
    object store, workers) run in child processes; PSS splits shared pages (Ray's object store in
    /dev/shm) among the processes mapping them, so the sum is not double-counted. Linux only;
    elsewhere it reports 0.
    """

    interval_s: float = 0.5
    peak_mb: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> TreeMemory:
        if Path("/proc/self/smaps_rollup").exists():
            self._thread = threading.Thread(target=self._run, name="tree-memory", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        if self._thread is None:
            return
        total_kb = sum(_pss_kb(pid) for pid in _descendants(os.getpid()))
        self.peak_mb = max(self.peak_mb, total_kb / 1024)


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # the process ended while we looked
        # The command name (field 2) may hold spaces and parentheses; ppid follows the last ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def driver_peak_rss_mb() -> float:
    """This process's peak RSS (Linux reports kilobytes, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def claim_stdout() -> TextIO:
    """Keep stdout for the result line alone: point file descriptor 1 at stderr for everything
    else, including what the readers' worker processes and libraries print, and hand back a
    stream on the original stdout for ``emit``."""
    sys.stdout.flush()
    result = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    return result


def emit(
    out: TextIO,
    measurement: Measurement,
    memory: TreeMemory,
    args: argparse.Namespace,
    settings: dict[str, Any],
) -> None:
    """Print the one JSON line ``envs.run_baseline`` parses to ``out`` (see ``claim_stdout``)."""
    result = {
        "rows": measurement.rows,
        "seconds": round(measurement.seconds, 4),
        "rows_per_s": round(measurement.rows_per_s, 1),
        "first_batch_s": round(measurement.first_batch_s, 4),
        "peak_rss_mb": round(driver_peak_rss_mb(), 1),
        "peak_tree_pss_mb": round(memory.peak_mb, 1),
        "total_rows": measurement.total_rows,
        "batches": measurement.batches,
        "wall_s": round(measurement.wall_s, 4),
        "settings": {
            "batch_size": args.batch_size,
            "shuffle": args.shuffle,
            "stack": args.stack,
            "warmup_batches": args.warmup_batches,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            **settings,
        },
    }
    out.write(json.dumps(result) + "\n")
    out.flush()
