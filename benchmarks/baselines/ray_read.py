"""Ray Data baseline: ``ray.data.read_parquet`` + ``Dataset.iter_torch_batches``.

    PYTHONPATH=benchmarks $FLOW_HOME/bench-envs/ray/bin/python -m baselines.ray_read \\
        --parquet DIR [--shuffle] [--no-stack]

Runs inside its own venv (``requirements-ray.txt``; ``envs.run_baseline`` sets it up) and prints
one JSON line (see ``readloop``). Ray starts a local single-node cluster on 127.0.0.1 with no
dashboard, ``--num-cpus`` CPUs (default: all of them) and a small object store, so it fits
beside the rest of a benchmark on a 24 GB machine.

Shuffled means Ray Data's streaming shuffles: file order (``read_parquet(shuffle="files")``)
and a local buffer in the iterator (``local_shuffle_buffer_size``, default 4 batches of rows, the
same buffer Petastorm gets). Unshuffled passes neither. A global ``random_shuffle()`` is left out:
it is an all-to-all exchange, which Petastorm has no counterpart for either.

Tried on the 2-core machine (4M rows, two runs each): ``--prefetch-batches 4`` and
``--num-cpus 1`` (a core left to the driver) were both within run-to-run noise of the defaults,
and so was torch's default thread count, so Ray's own defaults are kept (with the shared
``--torch-threads 1``). Most of Ray's time is
start-up: ``ray.init`` 3.5-8 s and another 5-12 s to the first batch (starting the read workers).

``ray.init`` time is reported apart (``settings.ray_init_s``): it is paid once per process, not
per epoch, so it is kept out of ``first_batch_s``, which starts at ``read_parquet``.
``peak_rss_mb`` is the driver alone; Ray's raylet, GCS, object store and read workers are
separate processes, which ``peak_tree_pss_mb`` adds in.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterable
from importlib.metadata import version
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


def parse_args() -> argparse.Namespace:
    parser = build_parser(__doc__.splitlines()[0])
    parser.add_argument("--num-cpus", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--object-store-gb", type=float, default=2.0)
    parser.add_argument("--prefetch-batches", type=int, default=1, help="iter_torch_batches'")
    return parser.parse_args()


def start_ray(args: argparse.Namespace) -> tuple[Any, float]:
    """A lean local Ray: no dashboard, no usage reporting (the machine has no outside network)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started = time.perf_counter()
    import ray  # type: ignore[import-not-found]

    ray.init(
        num_cpus=args.num_cpus,
        object_store_memory=int(args.object_store_gb * 1024**3),
        include_dashboard=False,
        logging_level="warning",
    )
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    return ray, time.perf_counter() - started


def open_batches(ray: Any, args: argparse.Namespace, buffer_rows: int) -> Iterable[Batch]:
    dataset = ray.data.read_parquet(str(args.parquet), shuffle="files" if args.shuffle else None)
    return dataset.iter_torch_batches(  # type: ignore[no-any-return]
        batch_size=args.batch_size,
        local_shuffle_buffer_size=buffer_rows if args.shuffle else None,
        prefetch_batches=args.prefetch_batches,
        device="cpu",
    )


def main() -> None:
    args = parse_args()
    out = claim_stdout()
    set_torch_threads(args.torch_threads)
    buffer_rows = shuffle_buffer_rows(args)
    with TreeMemory() as memory:
        ray, init_s = start_ray(args)
        try:
            result = measure(
                lambda: open_batches(ray, args, buffer_rows),
                warmup_batches=args.warmup_batches,
                stack=args.stack,
            )
        finally:
            ray.shutdown()
    settings = {
        "reader": "ray.data.read_parquet + Dataset.iter_torch_batches",
        "ray": version("ray"),
        "pyarrow": version("pyarrow"),
        "ray_init_s": round(init_s, 3),
        "num_cpus": args.num_cpus,
        "object_store_gb": args.object_store_gb,
        "prefetch_batches": args.prefetch_batches,
        "file_shuffle": args.shuffle,
        "local_shuffle_buffer_size": buffer_rows if args.shuffle else None,
    }
    emit(out, result, memory, args, settings)


if __name__ == "__main__":
    main()
