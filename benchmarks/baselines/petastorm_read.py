"""Petastorm baseline: ``make_batch_reader`` + ``petastorm.pytorch.BatchedDataLoader``.

    PYTHONPATH=benchmarks $FLOW_HOME/bench-envs/petastorm/bin/python -m baselines.petastorm_read \\
        --parquet DIR [--shuffle] [--no-stack] [--pool thread --workers 2]

Runs inside its own venv (``requirements-petastorm.txt``; ``envs.run_baseline`` sets it up) and
prints one JSON line (see ``readloop``). This is Petastorm's fastest path for flat scalar columns:
the batch reader hands over whole row groups as Arrow-backed numpy columns, and the batched loader
cuts them into torch batches (its torch-based shuffling buffer is far faster than ``DataLoader``'s
row-at-a-time one).

Shuffled means both of Petastorm's shuffles: row-group order (``shuffle_row_groups=True``) and a
row-level buffer in the loader (``shuffling_queue_capacity``, default 4 batches of rows, which is
also the buffer Ray's ``local_shuffle_buffer_size`` gets). Unshuffled turns both off.

Settings, measured on the 2-core dev machine (shared with other work, so +-30% run to run), 4M
rows in 16 files of 64k-row groups, batch 4096, stacked, two runs each; rows/s after warm-up:

=======================  ===================  ===================
reader_pool_type         unshuffled           shuffled
=======================  ===================  ===================
thread, 1 worker         1.53M / 1.71M        (1M rows: 0.38-0.50M)
thread, 2 workers        1.46M / 1.40M        0.43M / 0.46M
thread, 4 workers        1.45M / 1.50M        0.40M / 0.40M
thread, 10 (its default) 1.94M / 1.48M        0.35M / 0.31M
process, 2 workers       1.15M / 1.18M        0.44M / 0.31M
dummy (consumer thread)  1.39M / 1.64M        (1M rows: 0.26-0.41M)
=======================  ===================  ===================

The default here is ``thread`` with 2 workers: the best shuffled, level with the rest
unshuffled (which is bound by the loader and stacking, not by reading), and ~300 MB less memory
than 10 workers.
``process`` pays to serialize every row group through ZeroMQ and starts 1.5-3 s slower.
Shuffled is slow because the loader's shuffling buffer gathers each of the 40 columns separately
for every batch out of a buffer that grows by whole row groups (64k rows).

torch's intra-op threads matter more than any of these: with torch's default (one per core) the
shuffled thread-pool path ran at 45-80k rows/s, its OpenMP threads apparently contending with
the reader's threads; ``--torch-threads 1`` (the default, see ``readloop``) fixes that.

Petastorm 0.13.1 drives pyarrow's legacy ``ParquetDataset`` (removed in pyarrow 15), hence the
pin to pyarrow 14; its FutureWarnings about that, and torch's warning that the Arrow-backed numpy
arrays are read-only, are silenced here because they say nothing about speed.
"""

from __future__ import annotations

import argparse
import contextlib
import warnings
from collections.abc import Iterable
from importlib.metadata import version
from pathlib import Path
from typing import Any

from baselines.readloop import (
    Batch,
    TreeMemory,
    build_parser,
    claim_stdout,
    emit,
    measure,
    set_torch_threads,
    shuffle_buffer_rows,
)

POOLS = ("thread", "process", "dummy")


def parse_args() -> argparse.Namespace:
    parser = build_parser(__doc__.splitlines()[0])
    parser.add_argument("--pool", choices=POOLS, default="thread", help="reader_pool_type")
    parser.add_argument("--workers", type=int, default=2, help="workers_count")
    parser.add_argument("--results-queue", type=int, default=50, help="results_queue_size")
    return parser.parse_args()


def quiet_warnings() -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def open_loader(
    stack: contextlib.ExitStack[Any], args: argparse.Namespace, buffer_rows: int
) -> Iterable[Batch]:
    """Create the reader and loader; ``stack`` stops the reader's pool after the timed loop."""
    from petastorm import make_batch_reader  # type: ignore[import-not-found]
    from petastorm.pytorch import BatchedDataLoader  # type: ignore[import-not-found]

    reader = make_batch_reader(
        Path(args.parquet).resolve().as_uri(),
        reader_pool_type=args.pool,
        workers_count=args.workers,
        results_queue_size=args.results_queue,
        shuffle_row_groups=args.shuffle,
        num_epochs=1,
    )
    loader = BatchedDataLoader(
        reader,
        batch_size=args.batch_size,
        shuffling_queue_capacity=buffer_rows if args.shuffle else 0,
    )
    stack.enter_context(loader)
    return loader  # type: ignore[no-any-return]


def main() -> None:
    args = parse_args()
    out = claim_stdout()
    set_torch_threads(args.torch_threads)
    quiet_warnings()
    buffer_rows = shuffle_buffer_rows(args)
    with contextlib.ExitStack() as stack, TreeMemory() as memory:
        result = measure(
            lambda: open_loader(stack, args, buffer_rows),
            warmup_batches=args.warmup_batches,
            stack=args.stack,
        )
    settings = {
        "reader": "petastorm.make_batch_reader + petastorm.pytorch.BatchedDataLoader",
        "petastorm": version("petastorm"),
        "pyarrow": version("pyarrow"),
        "reader_pool_type": args.pool,
        "workers_count": args.workers,
        "results_queue_size": args.results_queue,
        "shuffle_row_groups": args.shuffle,
        "shuffling_queue_capacity": buffer_rows if args.shuffle else 0,
    }
    emit(out, result, memory, args, settings)


if __name__ == "__main__":
    main()
