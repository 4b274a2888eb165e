"""Training fed by the handoff against the same training fed from memory, in the same run.

    flow bench trainer                                   # CPU: DLRM, batch 4096, a quick look
    flow bench trainer --device cuda --models dlrm,deepfm --batch-sizes 16384,32768,65536 \\
        --bf16 both --compile both --feeds memory,host,device,parquet
    flow bench trainer --device cuda --cores 1,2,4,8,16  # how many cores the reader needs

The same CTR model (DLRM or DeepFM over 13 dense and 26 categorical Criteo-shaped features)
trains the same number of steps from each feed:

* ``memory``: batches already on the device (the ceiling: no data path at all);
* ``host``: the handoff reader with its window shuffle gathered on the host, then copied;
* ``device``: the same reader, each window copied in order and shuffled on the device (the
  same batches as ``host``; see trainers/loader.py);
* ``parquet``: a plain PyTorch DataLoader over the same rows as Parquet, shuffled by row group,
  with ``--parquet-workers`` worker processes (benchmarks/baselines/torch_parquet.py);
* ``host-read``, ``device-read``: the handoff loader alone, no model: the rows/s its host side
  delivers to the device, to set against the rows/s the model consumes (``memory``).

Per case: samples/s, the throughput relative to ``memory`` in the same case, the data-stall
fraction (on CUDA the GPU's idle time waiting for the next batch, on its own clock, over the
timed wall time, as the trainer measures it; on CPU the loop's wait), GPU utilisation (NVML,
sampled) and the CPU cores the process and its workers used. With
``--cores`` each count runs in its own process pinned to that many cores (the reader gets as
many decoding threads), to show how many the reader needs to keep the GPU fed.

Needs no JVM and no services: on a bare GPU machine, ``python benchmarks/trainer.py`` with
numpy, pyarrow, xxhash, rich and torch installed. Results print, and go to
$FLOW_HOME/bench/trainer-<time>.{json,png}.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _results import save
from handoff import (
    BUCKETS,
    CARDINALITIES,
    DENSE,
    SCHEMA,
    SPARSE,
    criteo_rows,
    write_parquet,
)
from torch import nn

from flow.config import BENCH_RESULT_ENV, StackConfig
from flow.console import console
from flow.handoff import Channel, ChannelReader, Commit, ReadOptions, ShardInfo
from flow.pipeline.state import Layout
from flow.training import ModelConfig, OptimConfig
from trainers.graphed import GraphedStep
from trainers.loader import DeviceLoader
from trainers.models import build_model
from trainers.optim import build_optimizer

NEEDS_SERVICES = False
NEEDS_SPARK = False  # plain Python: runs on a GPU machine without Java
FEEDS = ("memory", "host", "device", "parquet", "host-read", "device-read")
CHUNK = 1 << 20  # rows per commit when writing the channel
out = console()
LAYOUT = Layout(
    dense=tuple(f"d{j}" for j in range(DENSE)),
    sparse=tuple((f"c{j}", int(CARDINALITIES[j])) for j in range(SPARSE)),
    sequences=(),
)
COLUMNS = ["label", "dense", "sparse"]


@dataclass(frozen=True)
class Case:
    model: str
    batch: int
    bf16: bool
    compile: bool
    graph: bool = False

    def label(self) -> str:
        flags = [f"{self.batch // 1024}k", "bf16" if self.bf16 else "fp32"]
        if self.compile:
            flags.append("compiled")
        if self.graph:
            flags.append("graphed")
        return f"{self.model} {' '.join(flags)}"


# -- data ----------------------------------------------------------------------------------------


def _write_commit(root: str, batch_id: int, rows: int, compression: str | None) -> list[ShardInfo]:
    """One commit's shards (run in a worker process): rows bucketed and permuted as Spark does."""
    channel = Channel(root, "criteo")
    chunk = criteo_rows(rows, seed=batch_id)
    rng = np.random.default_rng(batch_id)
    buckets = rng.integers(0, BUCKETS, chunk.num_rows)
    shards = []
    for bucket in range(BUCKETS):
        part = chunk.take(rng.permutation(np.flatnonzero(buckets == bucket)))
        shards.append(channel.write_bucket(batch_id, bucket, part, "bench"))
    return shards


def write_data(root: Path, rows: int, compression: str | None, parquet: bool) -> None:
    """The channel (commits of CHUNK rows, written by parallel processes) and, if asked, the
    same rows as Parquet for the DataLoader baseline."""
    shutil.rmtree(root, ignore_errors=True)
    channel = Channel(str(root), "criteo")
    meta = channel.create(
        SCHEMA, num_buckets=BUCKETS, compression=compression, layout=LAYOUT.to_dict()
    )
    sizes = [min(CHUNK, rows - start) for start in range(0, rows, CHUNK)]
    workers = max(1, min(len(sizes), (os.cpu_count() or 2)))
    # fork: nothing has started CUDA or threads yet, and the workers need this module.
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        jobs = [
            pool.submit(_write_commit, str(root), b, n, compression) for b, n in enumerate(sizes)
        ]
        for batch_id, job in enumerate(jobs):
            channel.add_commit(Commit("criteo", batch_id, tuple(job.result()), meta.fingerprint))
    if parquet:
        write_parquet(root / "parquet", (criteo_rows(n, seed=b) for b, n in enumerate(sizes)))


# -- one training step -----------------------------------------------------------------------


def make_step(
    case: Case, device: torch.device, max_rows: int
) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(
            case.model,  # type: ignore[arg-type]  # checked by ModelConfig
            embedding_dim=16,
            hidden=(512, 256),
            bottom=(128,),
            max_embedding_rows=max_rows,
        ),
        LAYOUT,
    ).to(device)
    # Adam on both groups, as when the recorded figures were taken (the trainer's default
    # embedding optimizer is Adagrad since; its step costs about the same).
    optimizer = build_optimizer(
        model,
        OptimConfig(embedding="adam", embedding_lr=None, lr=1e-3),
        capturable=case.graph,
    )
    net: nn.Module = torch.compile(model) if case.compile else model  # type: ignore[assignment]

    def step(batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        # No autocast cache: a graph must not read casts made outside it (trainers/graphed.py).
        with torch.autocast(
            device.type, dtype=torch.bfloat16, enabled=case.bf16, cache_enabled=not case.graph
        ):
            logits = net(batch)
        loss = nn.functional.binary_cross_entropy_with_logits(logits.float(), batch["label"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        return loss.detach()

    return GraphedStep(step, device) if case.graph else step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Meter:
    """Wall time, CPU time of this process and its children, and sampled GPU utilisation."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _cpu(self) -> dict[int, float]:
        """CPU seconds of this process and of each live child (DataLoader workers), by pid."""
        own = resource.getrusage(resource.RUSAGE_SELF)
        found = {0: own.ru_utime + own.ru_stime}
        with contextlib.suppress(Exception):  # worker processes, when psutil is there
            import psutil

            for child in psutil.Process().children(recursive=True):
                times = child.cpu_times()
                found[child.pid] = times.user + times.system
        return found

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.samples.append(float(torch.cuda.utilization(self.device)))
            except Exception:  # no NVML: utilisation is not reported
                return

    def start(self) -> None:
        sync(self.device)
        self.wall, self.cpu = time.perf_counter(), self._cpu()
        if self.device.type == "cuda":
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()

    def stop(self, rows: int, waited: float | None) -> dict[str, Any]:
        sync(self.device)
        seconds = time.perf_counter() - self.wall
        now = self._cpu()  # a process that ended in between is left out, not subtracted
        cpu = sum(seconds - self.cpu.get(pid, 0.0) for pid, seconds in now.items())
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        result: dict[str, Any] = {
            "seconds": seconds,
            "samples_per_s": rows / seconds,
            "cpu_cores_used": cpu / seconds,
        }
        if waited is not None:
            result["data_stall_fraction"] = waited / seconds
        if self.samples:
            result["gpu_util_pct"] = statistics.mean(self.samples)
        return result


# -- feeds -------------------------------------------------------------------------------------


def handoff_loader(
    args: argparse.Namespace, device: torch.device, batch: int, shuffle_on: str
) -> DeviceLoader:
    options = ReadOptions(
        batch_size=batch,
        window_rows=batch * args.window_batches,
        shuffle=True,
        threads=args.reader_threads,
    )
    reader = ChannelReader(str(args.data), "criteo", options=options)
    return DeviceLoader(reader, device, COLUMNS, shuffle_on=shuffle_on)  # type: ignore[arg-type]


def endless(make: Callable[[], Iterable[Any]]) -> Iterator[Any]:
    while True:
        yield from make()


def timed(
    step: Callable[[dict[str, torch.Tensor]], Any],
    batches: Iterator[dict[str, torch.Tensor]],
    args: argparse.Namespace,
    device: torch.device,
    batch: int,
) -> dict[str, Any]:
    """``warmup`` untimed steps, then ``steps`` timed ones.

    Two waits are summed over the timed steps: the loop's (asking for a batch until it has
    it) and, on CUDA, the GPU's (from the end of the work queued before asking until the batch
    is ready on the compute stream, on the GPU's clock). The GPU's is the data stall: the loop
    only queues work, so it can wait while the GPU is still busy with earlier steps.
    """
    cuda = device.type == "cuda"
    meter = Meter(device)
    waited = 0.0
    idle: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    for done in range(1, args.warmup + args.steps + 1):
        asked = _event(device) if cuda else None
        started = time.perf_counter()
        tensors = next(batches)
        if done == args.warmup + 1:
            meter.start()  # the first timed batch's wait began before the clock: not counted
        elif done > args.warmup + 1:
            waited += time.perf_counter() - started
            if asked is not None:
                idle.append((asked, _event(device)))
        step(tensors)
    result = meter.stop(args.steps * batch, waited)
    if idle:
        gpu_idle = sum(a.elapsed_time(b) for a, b in idle) / 1000
        result["loop_wait_fraction"] = result.pop("data_stall_fraction")
        result["data_stall_fraction"] = gpu_idle / result["seconds"]
    return result


def _event(device: torch.device) -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    event.record(torch.cuda.current_stream(device))
    return event


def run_feed(
    feed: str,
    step: Callable[[dict[str, torch.Tensor]], torch.Tensor],
    case: Case,
    args: argparse.Namespace,
    device: torch.device,
) -> dict[str, Any]:
    if feed == "memory":
        source = handoff_loader(args, device, case.batch, "host")
        kept = []
        for item in endless(lambda: source):
            kept.append({k: v.to(device, copy=True) for k, v in item.tensors.items()})
            if len(kept) == args.memory_batches:
                break
        memory = (kept[i % len(kept)] for i in range(args.warmup + args.steps))
        result = timed(step, memory, args, device, case.batch)
        result.pop("data_stall_fraction")
        result.pop("loop_wait_fraction", None)
        return result
    place, _, read_only = feed.partition("-")
    if place in ("host", "device") and read_only in ("", "read"):
        # "-read": the loader alone, no model: the rows/s the host side can deliver.
        loader = handoff_loader(args, device, case.batch, place)
        batches = (b.tensors for b in endless(lambda: loader))
        result = timed(_nothing if read_only else step, batches, args, device, case.batch)
        if read_only:  # no model: nothing waits, the rate is the point
            result.pop("data_stall_fraction", None)
            result.pop("loop_wait_fraction", None)
        return result
    if feed == "parquet":
        sys.path.insert(0, str(Path(__file__).parent))
        from baselines.torch_parquet import parquet_loader

        baseline = parquet_loader(
            args.data / "parquet",
            case.batch,
            args.parquet_workers,
            pin=device.type == "cuda",
            dense=DENSE,
            sparse=SPARSE,
        )
        return timed(step, _parquet_batches(baseline, device), args, device, case.batch)
    raise SystemExit(f"unknown feed {feed!r}; use {', '.join(FEEDS)}")


def _nothing(batch: dict[str, torch.Tensor]) -> None:
    """The step of a read-only feed."""


def _parquet_batches(
    loader: Iterable[dict[str, torch.Tensor]], device: torch.device
) -> Iterator[dict[str, torch.Tensor]]:
    """The DataLoader's batches on the device (copied from its pinned memory), epoch after
    epoch."""
    while True:
        for batch in loader:
            yield {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def run_cases(args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    results = []
    for model in args.models:
        for batch in args.batch_sizes:
            for bf16 in args.bf16:
                for compiled, graph in itertools.product(args.compile, args.cuda_graph):
                    case = Case(model, batch, bf16, compiled, graph)
                    step = make_step(case, device, args.max_embedding_rows)
                    row: dict[str, Any] = asdict(case) | {"feeds": {}}
                    for feed in args.feeds:
                        out.print(f"  {case.label()}: {feed} ...")
                        try:
                            row["feeds"][feed] = run_feed(feed, step, case, args, device)
                        except Exception as exc:  # reported with the others, not fatal
                            out.print(f"  [yellow]{feed} failed:[/] {exc!r}"[:2000])
                            row["feeds"][feed] = {"error": repr(exc)[:2000]}
                    memory = row["feeds"].get("memory", {}).get("samples_per_s")
                    for result in row["feeds"].values():
                        if memory and "samples_per_s" in result:
                            result["vs_memory"] = result["samples_per_s"] / memory
                    results.append(row)
    return results


# -- cores -------------------------------------------------------------------------------------


def run_cores(args: argparse.Namespace, stamp: str) -> list[dict[str, Any]]:
    """Each core count in its own process, pinned to that many cores, the reader with as many
    decoding threads: the first cases of the grid, fed by ``--cores-feeds``."""
    available = sorted(os.sched_getaffinity(0))
    results = []
    for count in args.cores:
        if count > len(available):
            out.print(f"  [yellow]{count} cores asked, {len(available)} available: skipped[/]")
            continue
        cores = available[:count]
        path = args.data.parent / f"cores-{stamp}-{count}.json"
        argv = [
            sys.executable,
            __file__,
            "--device", args.device,
            "--data", str(args.data), "--reuse-data",
            "--models", args.models[0],
            "--batch-sizes", str(args.batch_sizes[0]),
            "--bf16", "on" if args.bf16[0] else "off",
            "--compile", "on" if args.compile[0] else "off",
            "--cuda-graph", "on" if args.cuda_graph[0] else "off",
            "--feeds", ",".join(args.cores_feeds),
            "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--reader-threads", str(count),
            "--parquet-workers", str(count),
            "--max-embedding-rows", str(args.max_embedding_rows),
            "--result-file", str(path), "--no-plot",
            "--pin-cores", ",".join(map(str, cores)),
        ]  # fmt: skip
        out.print(f"  {count} core(s): {', '.join(args.cores_feeds)} ...")
        env = {**os.environ, "OMP_NUM_THREADS": str(count)}
        env.pop(BENCH_RESULT_ENV, None)  # a core count's run is not the benchmark's result
        done = subprocess.run(argv, env=env, check=False)
        if done.returncode or not path.exists():
            results.append({"cores": count, "error": f"exit {done.returncode}"})
            continue
        found = json.loads(path.read_text())["cases"][0]
        results.append({"cores": count, **found})
    return results


# -- report ------------------------------------------------------------------------------------


def _case(row: dict[str, Any]) -> Case:
    """A result row's case (rows written before ``graph`` existed have none)."""
    return Case(row["model"], row["batch"], row["bf16"], row["compile"], row.get("graph", False))


def show(results: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"trainer feeds on {results['device']}")
    columns = ("case", "feed", "samples/s", "vs memory", "stall", "loop wait", "GPU util", "CPU")
    for column in columns:
        table.add_column(column, justify="left" if column in ("case", "feed") else "right")

    def add(label: str, feeds: dict[str, Any]) -> None:
        for feed, r in feeds.items():
            if "error" in r:
                table.add_row(label, feed, "error", "", "", "", "", "")
                continue
            table.add_row(
                label,
                feed,
                f"{r['samples_per_s']:,.0f}",
                f"{r['vs_memory']:.3f}" if "vs_memory" in r else "",
                f"{r['data_stall_fraction']:.1%}" if "data_stall_fraction" in r else "",
                f"{r['loop_wait_fraction']:.1%}" if "loop_wait_fraction" in r else "",
                f"{r['gpu_util_pct']:.0f} %" if "gpu_util_pct" in r else "",
                f"{r['cpu_cores_used']:.1f}",
            )
            label = ""

    for row in results["cases"]:
        add(_case(row).label(), row["feeds"])
    for row in results.get("cores", []):
        if "feeds" in row:
            add(f"{row['cores']} core(s)", row["feeds"])
    out.print(table)


def plot(results: dict[str, Any], path: Path) -> None:
    """Samples/s per case and feed (bars), the stall fraction written beside each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    for row in results["cases"]:
        label = _case(row).label()
        rows += [(f"{label} · {f}", r) for f, r in row["feeds"].items() if "samples_per_s" in r]
    for row in results.get("cores", []):
        rows += [
            (f"{row['cores']} cores · {f}", r)
            for f, r in row.get("feeds", {}).items()
            if "samples_per_s" in r
        ]
    if not rows:
        return
    colors = {"memory": "tab:gray", "host": "tab:orange", "device": "tab:blue"}
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(rows) + 1.4))
    values = [r["samples_per_s"] / 1e6 for _, r in rows]
    ax.barh(
        [n for n, _ in rows],
        values,
        color=[colors.get(n.rsplit(" · ", 1)[1], "tab:green") for n, _ in rows],
    )
    for y, (_, r) in enumerate(rows):
        stall = r.get("data_stall_fraction")
        note = f" {r['samples_per_s'] / 1e6:.2f}M" + (f", stall {stall:.0%}" if stall else "")
        ax.text(r["samples_per_s"] / 1e6, y, note, va="center", fontsize=7)
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlabel("million samples/s (training steps, same model and batch per group)")
    ax.set_title(f"Feeding a CTR trainer on {results['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- main --------------------------------------------------------------------------------------


def _flags(text: str) -> list[bool]:
    return {"on": [True], "off": [False], "both": [False, True]}[text]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description="Trainer feeds: memory, handoff, Parquet")
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--models", default="dlrm", help="dlrm,deepfm")
    parser.add_argument("--batch-sizes", default=None, help="e.g. 16384,32768,65536")
    parser.add_argument("--bf16", choices=["on", "off", "both"], default=None)
    parser.add_argument("--compile", choices=["on", "off", "both"], default="off")
    parser.add_argument(
        "--cuda-graph",
        choices=["on", "off", "both"],
        default="off",
        help="capture each step as a CUDA graph (trainers/graphed.py; Adam, CUDA only)",
    )
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="Python's GIL switch interval in seconds (default 0.005): how long the training "
        "loop can wait for the loader's thread to give up the GIL",
    )
    parser.add_argument("--feeds", default="memory,host,device", help=",".join(FEEDS))
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--window-batches", type=int, default=16)
    parser.add_argument("--reader-threads", type=int, default=None)
    parser.add_argument("--parquet-workers", type=int, default=None)
    parser.add_argument("--memory-batches", type=int, default=64)
    parser.add_argument("--max-embedding-rows", type=int, default=None)
    parser.add_argument("--compression", default="lz4", help="lz4, zstd or none")
    parser.add_argument("--rows", type=int, default=None, help="rows in the channel")
    parser.add_argument("--cores", default="", help="core counts to sweep, e.g. 1,2,4,8,16")
    parser.add_argument("--cores-feeds", default="memory,host,device")
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--reuse-data", action="store_true", help="the channel in --data exists")
    parser.add_argument("--result-file", type=Path, help="also write the results here")
    parser.add_argument("--no-plot", action="store_true", help="no chart (a --cores child)")
    parser.add_argument("--pin-cores", help="run on these cores only (a --cores child)")
    args = parser.parse_args(argv)
    gpu = args.device.startswith("cuda")
    args.models = args.models.split(",")
    args.batch_sizes = [
        int(b) for b in (args.batch_sizes or ("32768" if gpu else "4096")).split(",")
    ]
    args.bf16 = _flags(args.bf16 or ("on" if gpu else "off"))
    args.compile = _flags(args.compile)
    args.cuda_graph = _flags(args.cuda_graph)
    if any(args.cuda_graph) and not gpu:
        parser.error("--cuda-graph needs --device cuda")
    args.feeds = args.feeds.split(",")
    args.cores_feeds = args.cores_feeds.split(",")
    args.cores = [int(c) for c in args.cores.split(",") if c]
    args.steps = args.steps or (200 if gpu else 60)
    args.warmup = args.warmup or (20 if gpu else 5)
    cpus = len(os.sched_getaffinity(0))
    args.reader_threads = args.reader_threads or max(2, min(8, cpus - 2))
    args.parquet_workers = args.parquet_workers or max(1, min(8, cpus - 2))
    args.max_embedding_rows = args.max_embedding_rows or (2**20 if gpu else 2**17)
    args.compression = None if args.compression == "none" else args.compression
    # Enough rows that a pass never restarts an epoch mid-measurement.
    args.rows = args.rows or (args.warmup + args.steps + 2) * max(args.batch_sizes)
    args.data = args.data or StackConfig.from_env().home / "bench" / "trainer-data"
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.pin_cores:  # first, so every thread started later inherits it
        cores = [int(c) for c in args.pin_cores.split(",")]
        os.sched_setaffinity(0, cores)
        torch.set_num_threads(len(cores))
    device = torch.device(args.device)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    if not args.reuse_data:
        parquet = "parquet" in args.feeds or "parquet" in args.cores_feeds
        out.print(
            f"writing {args.rows:,} Criteo-shaped rows to a channel{' and Parquet' * parquet} ..."
        )
        started = time.perf_counter()
        write_data(args.data, args.rows, args.compression, parquet)
        out.print(f"  written in {time.perf_counter() - started:.1f} s")
    stamp = f"{datetime.now(UTC):%Y%m%dT%H%M%S}"
    results: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "cpus": len(os.sched_getaffinity(0)),
        "torch": torch.__version__,
        "settings": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k not in ("data", "result_file")
        },
    }
    results["cases"] = run_cases(args, device)
    if args.cores:
        results["cores"] = run_cores(args, stamp)
    path = save("trainer", results, folder=args.data.parent, at=stamp, also=args.result_file)
    show(results)
    if not args.no_plot:
        with contextlib.suppress(ImportError):
            plot(results, path.with_suffix(".png"))
            if args.result_file:
                shutil.copy(path.with_suffix(".png"), args.result_file.with_suffix(".png"))
    out.print(f"results: {path}")


if __name__ == "__main__":
    main()
