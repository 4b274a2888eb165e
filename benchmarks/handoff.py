"""The handoff feeding a trainer, against the loaders it replaces, measured in the same run.

    flow bench handoff                                   # 2M rows, everything
    flow bench handoff --rows 1000000 --skip-baselines --skip-spark

Criteo-shaped rows (label, 13 float32 dense, 26 int64 categorical), batches of 4096 rows,
turned into torch tensors as a trainer gets them (``dense`` [B, 13], ``sparse`` [B, 26]).

* readers: the handoff reader with its window shuffle on and off; raw pyarrow reading the same
  shard files in order (no shuffle, no checks: the floor of any Arrow loader); Petastorm's best
  path (``make_batch_reader`` + ``BatchedDataLoader``, with and without its shuffling queue) and
  Ray Data (``iter_torch_batches`` with and without a local shuffle buffer), each in its own
  virtual environment (Petastorm needs pyarrow 14) reading the same rows as Parquet. Each
  ratio to a baseline is against our reader measured just before and after that baseline ran.
* latency: a following reader, from a channel's first commit landing to its first batch.
* resume: a reader restarted from a cursor taken mid-epoch, to its first batch (and that batch
  is checked to be the one the interrupted reader would have produced).
* memory: peak Arrow memory and RSS of a reader over the whole channel and over a quarter of it,
  each in a fresh process: bounded by the window and prefetch, not by the data.
* spark write: Spark exporting a cached DataFrame to a channel against Spark writing the same
  DataFrame as Parquet, plainly and after the same repartition; ``--spark-rounds`` rounds of
  the three, in alternating order, and each ratio the median of the rounds' own ratios.

Results print, and go with a bar chart to $FLOW_HOME/bench/handoff-<time>.{json,png}.
"""

from __future__ import annotations

import argparse
import json
import queue
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from _results import save

from flow.config import StackConfig
from flow.console import console
from flow.handoff import Channel, ChannelReader, Commit, ReadOptions
from flow.pipeline.state import Layout
from trainers.data import to_tensors

NEEDS_SERVICES = False  # `flow bench handoff` leaves Kafka and MLflow down: nothing here uses them
BATCH = 4096
BUCKETS = 32
DENSE, SPARSE = 13, 26
SCHEMA = pa.schema(
    [
        pa.field("label", pa.float32(), False),
        pa.field("dense", pa.list_(pa.float32(), DENSE), False),
        pa.field("sparse", pa.list_(pa.int64(), SPARSE), False),
    ]
)
# Criteo's categorical columns range from a handful of values to millions.
CARDINALITIES = np.array([10 ** (2 + j % 5) for j in range(SPARSE)], dtype=np.float64)
out = console()


# -- data --------------------------------------------------------------------------------------


def criteo_rows(n: int, seed: int) -> pa.Table:
    """Criteo-shaped rows: count-like dense values, skewed (log-uniform) categorical ids."""
    rng = np.random.default_rng(seed)
    dense = (rng.geometric(0.05, (n, DENSE)) - 1).astype(np.float32)
    ids = np.exp(rng.random((n, SPARSE)) * np.log(CARDINALITIES)).astype(np.int64)
    hashed = (ids * 0x9E3779B1 + np.arange(SPARSE) * 0x85EBCA77) % (1 << 40)  # hashed-looking ids
    label = (rng.random(n) < 0.25).astype(np.float32)
    return pa.table(
        [
            pa.array(label),
            pa.FixedSizeListArray.from_arrays(pa.array(dense.reshape(-1)), DENSE),
            pa.FixedSizeListArray.from_arrays(pa.array(hashed.reshape(-1)), SPARSE),
        ],
        schema=SCHEMA,
    )


def write_channel(
    root: Path,
    name: str,
    chunks: Iterable[pa.Table],
    seed: int,
    layout: Layout | None = None,
    level: int | None = None,
) -> Channel:
    """One commit per chunk, one shard per bucket, rows bucketed and permuted as Spark does."""
    channel = Channel(str(root), name)
    meta = channel.create(
        SCHEMA,
        num_buckets=BUCKETS,
        compression="lz4",
        compression_level=level,
        layout=layout.to_dict() if layout else None,
    )
    rng = np.random.default_rng(seed)
    for batch_id, chunk in enumerate(chunks):
        buckets = rng.integers(0, BUCKETS, chunk.num_rows)
        shards = []
        for bucket in range(BUCKETS):
            rows = np.flatnonzero(buckets == bucket)
            part = chunk.take(pa.array(rng.permutation(rows)))
            shards.append(channel.write_bucket(batch_id, bucket, part, "bench"))
        channel.add_commit(Commit(name, batch_id, tuple(shards), meta.fingerprint))
    return channel


def write_parquet(folder: Path, chunks: Iterable[pa.Table], files_per_chunk: int = 4) -> None:
    """The same rows as flat Parquet columns (label, d0..d12, c0..c25): what Petastorm and Ray
    read best. Row groups of 64k rows, Snappy, as Spark writes them."""
    folder.mkdir(parents=True)
    n = 0
    for chunk in chunks:
        dense = chunk.column("dense").combine_chunks()
        sparse = chunk.column("sparse").combine_chunks()
        d = dense.flatten().to_numpy().reshape(-1, DENSE)
        c = sparse.flatten().to_numpy().reshape(-1, SPARSE)
        flat = pa.table(
            {"label": chunk.column("label")}
            | {f"d{j}": d[:, j] for j in range(DENSE)}
            | {f"c{j}": c[:, j] for j in range(SPARSE)}
        )
        step = -(-flat.num_rows // files_per_chunk)
        for start in range(0, flat.num_rows, step):
            pq.write_table(flat.slice(start, step), folder / f"part-{n:05d}.parquet",
                           row_group_size=65_536, compression="snappy")  # fmt: skip
            n += 1


# -- readers -----------------------------------------------------------------------------------


def timed_pass(batches: Callable[[], Iterator[pa.RecordBatch]]) -> tuple[int, float, float]:
    """(rows, seconds from first batch to the end, seconds to the first batch) of one pass."""
    start = time.perf_counter()
    rows = 0
    first = 0.0
    for batch in batches():
        tensors = to_tensors(batch)
        if not rows:
            first = time.perf_counter() - start
            start = time.perf_counter()
        rows += len(tensors["label"])
    return rows, time.perf_counter() - start, first


def measure(batches: Callable[[], Iterator[pa.RecordBatch]], repeat: int) -> dict[str, float]:
    """Median over ``repeat`` passes after one untimed pass (page cache, allocator, imports)."""
    timed_pass(batches)
    runs = [timed_pass(batches) for _ in range(repeat)]
    rates = [rows / seconds for rows, seconds, _ in runs]
    return {
        "rows": runs[0][0],
        "rows_per_s": statistics.median(rates),
        "first_batch_s": statistics.median(f for _, _, f in runs),
    }


def handoff_reader(root: Path, name: str, shuffle: bool, **extra: Any) -> ChannelReader:
    return ChannelReader(
        str(root), name, options=ReadOptions(batch_size=BATCH, shuffle=shuffle, **extra)
    )


def raw_pyarrow(channel: Channel) -> Iterator[pa.RecordBatch]:
    """The shards in commit order, sliced into batches: no shuffle, no checksum, no balance.

    pyarrow's defaults, independent of the handoff's ``read_shard``: each file memory-mapped and
    decoded on Arrow's thread pool. (For one thread reading in order, 8 alternating passes gave
    8.9M rows/s this way and 8.8M reading each file and decoding without the pool.)
    """
    for batch_id in channel.commit_ids():
        for shard in channel.commit(batch_id).shards:
            with pa.memory_map(f"{channel.folder.path}/{shard.path}") as source:
                table = pa.ipc.open_file(source).read_all()
            yield from table.to_batches(max_chunksize=BATCH)


def bench_readers(root: Path, parquet: Path, repeat: int, baselines: bool) -> dict[str, Any]:
    channel = Channel(str(root), "criteo")
    results: dict[str, Any] = {}
    stats: list[float] = []

    def ours(shuffle: bool) -> dict[str, float]:
        def run() -> Iterator[pa.RecordBatch]:
            reader = handoff_reader(root, "criteo", shuffle)
            yield from reader
            stats.append(reader.stats.shards_per_batch)

        return measure(run, repeat) | {"shards_per_batch": stats[-1]}

    for shuffle in (True, False):
        label = "shuffled" if shuffle else "unshuffled"
        out.print(f"  handoff reader, {label} ...")
        results[f"handoff_{label}"] = ours(shuffle)
    out.print("  raw pyarrow, in order ...")
    results["raw_pyarrow"] = measure(lambda: raw_pyarrow(channel), repeat)
    if baselines:
        results.update(bench_baselines(parquet, lambda shuffle: ours(shuffle)["rows_per_s"]))
    return results


def bench_baselines(parquet: Path, ours: Callable[[bool], float]) -> dict[str, Any]:
    """Each baseline's run, with ours measured just before and just after it.

    The machine's speed drifts by up to 2x over minutes, and a baseline runs for 10-40 s some
    minutes after our readers were first measured: a ratio is taken against our rate around
    the baseline's own run (``handoff_around``), so drift moves both sides of it alike.
    """
    sys.path.insert(0, str(Path(__file__).parent))
    from baselines.envs import run_baseline

    home = StackConfig.from_env().home
    results: dict[str, Any] = {}
    for name in ("petastorm", "ray"):
        for shuffle in (False, True):
            label = f"{name}_{'shuffled' if shuffle else 'unshuffled'}"
            out.print(f"  {name}, {'shuffled' if shuffle else 'unshuffled'} (own venv) ...")
            before = ours(shuffle)
            try:
                results[label] = run_baseline(name, home, parquet, shuffle=shuffle)
            except Exception as exc:  # a baseline that cannot run is reported, not fatal
                out.print(f"  [yellow]{name} failed:[/] {str(exc)[-2000:]}", markup=True)
                results[label] = {"error": str(exc)[-2000:]}
                continue
            results[label]["handoff_around"] = [before, ours(shuffle)]
    return results


# -- latency, resume, memory -------------------------------------------------------------------


def bench_latency(root: Path, tries: int = 5) -> dict[str, float]:
    """A reader follows an empty channel; a commit lands; how long until its first batch."""
    rows = criteo_rows(100_000, seed=5)
    waits = []
    for attempt in range(tries):
        name = f"latency-{attempt}"
        channel = Channel(str(root), name)
        meta = channel.create(SCHEMA, num_buckets=BUCKETS, compression="lz4")
        shards = tuple(
            channel.write_bucket(0, b, rows.slice(b * 3000, 3000), "bench") for b in range(BUCKETS)
        )
        arrived: queue.Queue[float] = queue.Queue()

        def follow(name: str = name, arrived: queue.Queue[float] = arrived) -> None:
            for _ in handoff_reader(root, name, True, follow=True):
                arrived.put(time.perf_counter())
                return

        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        time.sleep(0.3)  # the reader is polling an empty channel
        landed = time.perf_counter()
        channel.add_commit(Commit(name, 0, shards, meta.fingerprint))
        waits.append(arrived.get(timeout=60) - landed)
        channel.close()
        thread.join(timeout=10)
    return {"median_s": statistics.median(waits), "max_s": max(waits), "tries": tries}


def bench_resume(root: Path, rows: int) -> dict[str, Any]:
    """Stop a shuffled reader mid-epoch, restart from its cursor, time the first batch."""
    after_batches = min(150, rows // (2 * BATCH))  # mid-epoch however few rows
    reader = handoff_reader(root, "criteo", True, seed=3)
    batches = iter(reader)
    for _ in range(after_batches):
        next(batches)
    state = reader.state_dict()
    expected = next(batches)
    start = time.perf_counter()
    restarted = handoff_reader(root, "criteo", True, seed=3)
    restarted.load_state_dict(state)
    first = next(iter(restarted))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "after_batches": after_batches, "exact": first.equals(expected)}


def memory_probe(root: str, name: str) -> None:
    """(Run in a fresh process.) Read a channel shuffled; print peak Arrow memory and RSS."""
    rows = 0
    for batch in handoff_reader(Path(root), name, True):
        rows += len(to_tensors(batch)["label"])
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    arrow = pa.default_memory_pool().max_memory() / 2**20
    print(json.dumps({"rows": rows, "peak_arrow_mb": arrow, "peak_rss_mb": peak_rss}))


def bench_memory(root: Path, chunks: list[pa.Table]) -> dict[str, Any]:
    """Peak memory over the whole channel and over a quarter of it: same shards, fewer commits."""
    write_channel(root, "quarter", chunks[: max(1, len(chunks) // 4)], seed=1)
    results = {}
    for name in ("criteo", "quarter"):
        probe = subprocess.run(
            [sys.executable, __file__, "--memory-probe", str(root), name],
            capture_output=True,
            text=True,
            check=True,
        )
        results[name] = json.loads(probe.stdout.strip().splitlines()[-1])
    decoded = sum(c.nbytes for c in chunks) / 2**20
    results["dataset_decoded_mb"] = decoded
    return results


# -- Spark: shards against Parquet -------------------------------------------------------------


def bench_spark_write(
    folder: Path, rows: int, rounds: int, level: int | None = None
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from spark_jobs.handoff import ExportOptions, export
    from spark_jobs.jvm import default_parallelism
    from spark_jobs.session import get_session

    spark = get_session(StackConfig.from_env(), app_name="flow-bench-handoff")
    cores = default_parallelism(spark)
    dense = F.array(*[F.floor(-F.log(F.rand(j)) * 20).cast("float") for j in range(DENSE)])
    sparse = F.array(
        *[F.pmod(F.xxhash64("id", F.lit(j)), F.lit(int(CARDINALITIES[j]))) for j in range(SPARSE)]
    )
    df = (
        spark.range(rows, numPartitions=2 * cores)
        .select(
            (F.rand(99) < 0.25).cast("float").alias("label"),
            dense.alias("dense"),
            sparse.alias("sparse"),
        )
        .cache()
    )
    df.count()
    options = ExportOptions(
        num_buckets=BUCKETS,
        compression_level=level,
        fixed_sizes={"dense": DENSE, "sparse": SPARSE},
    )
    tasks = min(BUCKETS, 2 * cores)

    def handoff() -> None:
        shutil.rmtree(folder / "shards", ignore_errors=True)
        export(df, Channel(str(folder / "shards"), "spark"), 0, options=options, writer="bench")

    def parquet() -> None:
        df.write.mode("overwrite").parquet(str(folder / "parquet"))

    def parquet_repartitioned() -> None:
        # What export does before writing: a random bucket and a repartition by it.
        bucket = F.pmod(F.xxhash64(F.rand(0), F.lit(0)), F.lit(BUCKETS))
        (
            df.withColumn("_b", bucket)
            .repartition(tasks, "_b")
            .drop("_b")
            .write.mode("overwrite")
            .parquet(str(folder / "parquet-shuffled"))
        )

    writers = {
        "handoff": handoff,
        "parquet": parquet,
        "parquet_repartitioned": parquet_repartitioned,
    }
    for write in writers.values():  # warm-up: JIT, codegen, the first shuffle
        write()
    seconds: dict[str, list[float]] = {k: [] for k in writers}
    order = list(writers.items())
    for r in range(rounds):
        # Alternate the order, so no writer always runs after the same one.
        for key, write in order if r % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            write()
            seconds[key].append(time.perf_counter() - start)
    rates = {k: rows / statistics.median(v) for k, v in seconds.items()}
    df.unpersist()

    def paired(other: str) -> float:
        """Median over rounds of each round's own ratio: drift between rounds cancels."""
        return statistics.median(
            o / h for o, h in zip(seconds[other], seconds["handoff"], strict=True)
        )

    return {
        "rows": rows,
        "cores": cores,
        "rounds": rounds,
        "python_task_s": python_task_cost(spark, rounds),
        "python_daemon": spark.conf.get("spark.python.daemon.module", "pyspark.daemon"),
        "rows_per_s": rates,
        "seconds": seconds,
        "ratio_vs_parquet": paired("parquet"),
        "ratio_vs_parquet_repartitioned": paired("parquet_repartitioned"),
    }


def python_task_cost(spark: Any, repeat: int, tasks: int = 16) -> float:
    """Seconds of wall time per empty Arrow task, all cores busy: PySpark's fixed cost a task.

    Compare runs with and without ``--conf spark.python.daemon.module=pyspark.daemon`` to see
    what ``spark_jobs.pyworker`` saves.
    """

    def nothing(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            pass
        return iter(())

    def run() -> float:
        start = time.perf_counter()
        spark.range(tasks, numPartitions=tasks).mapInArrow(nothing, "x int").collect()
        return time.perf_counter() - start

    run()  # workers started
    return statistics.median(run() for _ in range(repeat)) / tasks


# -- report ------------------------------------------------------------------------------------


def ratios(readers: dict[str, Any]) -> dict[str, float]:
    def rate(key: str) -> float | None:
        value = readers.get(key, {}).get("rows_per_s")
        return float(value) if value else None

    ours = {"shuffled": rate("handoff_shuffled"), "unshuffled": rate("handoff_unshuffled")}
    found = {}
    for other in ("petastorm", "ray"):
        for mode in ("shuffled", "unshuffled"):
            theirs = rate(f"{other}_{mode}")
            around = readers.get(f"{other}_{mode}", {}).get("handoff_around")
            mine = statistics.mean(around) if around else ours[mode]
            if theirs and mine:
                found[f"vs_{other}_{mode}"] = mine / theirs
    raw = rate("raw_pyarrow")
    if raw and ours["unshuffled"]:
        found["unshuffled_vs_raw_pyarrow"] = ours["unshuffled"] / raw
    return found


def plot(readers: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [k for k, v in readers.items() if "rows_per_s" in v]
    values = [readers[k]["rows_per_s"] / 1e6 for k in names]
    colors = ["tab:blue" if k.startswith("handoff") else "tab:gray" for k in names]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1.2))
    ax.barh(names, values, color=colors)
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("million rows/s into torch tensors (batch 4096, log scale)")
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:.2f}M", va="center")
    ax.set_title("Criteo-shaped rows into a trainer, same machine, same run")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def show(results: dict[str, Any]) -> None:
    readers = results.get("readers", {})
    for key, value in readers.items():
        if "rows_per_s" not in value:
            out.print(f"{key:24} failed")
            continue
        around = value.get("handoff_around")
        beside = (
            f"   (handoff just before / after: {around[0] / 1e6:.2f}M / {around[1] / 1e6:.2f}M)"
            if around
            else ""
        )
        out.print(f"{key:24} {value['rows_per_s'] / 1e6:8.2f}M rows/s{beside}")
    for key, value in results.get("ratios", {}).items():
        out.print(f"{key:32} {value:6.2f}x")
    if "latency" in results:
        out.print(f"first commit -> first batch   {results['latency']['median_s'] * 1000:.0f} ms")
    if "resume" in results:
        r = results["resume"]
        out.print(
            f"resume -> first batch         {r['seconds'] * 1000:.0f} ms (exact: {r['exact']})"
        )
    if "memory" in results:
        m = results["memory"]
        out.print(
            f"peak Arrow memory             {m['criteo']['peak_arrow_mb']:.0f} MB (all), "
            f"{m['quarter']['peak_arrow_mb']:.0f} MB (a quarter); data "
            f"{m['dataset_decoded_mb']:.0f} MB decoded"
        )
    if "spark_write" in results:
        s = results["spark_write"]
        out.print(
            "spark write rows/s            "
            + ", ".join(f"{k} {v:,.0f}" for k, v in s["rows_per_s"].items())
            + f" -> ratio {s['ratio_vs_parquet']:.2f} vs Parquet, "
            f"{s['ratio_vs_parquet_repartitioned']:.2f} vs Parquet after the same repartition "
            f"(medians of {s['rounds']} rounds' own ratios)"
        )
        out.print(
            f"python task fixed cost        {s['python_task_s'] * 1e3:.0f} ms a task "
            f"(empty mapInArrow, {s['python_daemon']})"
        )


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--memory-probe":
        memory_probe(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description="Handoff benchmark")
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--spark-rows", type=int, default=1_000_000)
    parser.add_argument("--skip-baselines", action="store_true")
    parser.add_argument("--skip-spark", action="store_true")
    parser.add_argument(
        "--spark-rounds", type=int, default=5, help="rounds of the three Spark writes"
    )
    parser.add_argument(
        "--compression-level",
        type=int,
        help="the channels' LZ4 level (default: the handoff's, -1); e.g. -8 for speed over bytes",
    )
    args = parser.parse_args()
    # As in the baselines' processes: one torch thread (the loaders' work is not torch's).
    torch.set_num_threads(1)
    if args.rows < 4 * BATCH * BUCKETS:
        parser.error(f"--rows must be at least {4 * BATCH * BUCKETS}")
    stack = StackConfig.from_env()
    work = stack.home / "bench" / "handoff-data"
    shutil.rmtree(work, ignore_errors=True)
    results: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(),
        "rows": args.rows,
        "compression_level": args.compression_level,
    }
    out.print(f"writing {args.rows:,} Criteo-shaped rows as a channel and as Parquet ...")
    per = args.rows // 4
    chunks = [criteo_rows(per, seed=i) for i in range(4)]
    write_channel(work, "criteo", chunks, seed=0, level=args.compression_level)
    write_parquet(work / "parquet", chunks)
    out.print("readers:")
    results["readers"] = bench_readers(work, work / "parquet", args.repeat, not args.skip_baselines)
    results["ratios"] = ratios(results["readers"])
    out.print("latency, resume, memory ...")
    results["latency"] = bench_latency(work)
    results["resume"] = bench_resume(work, args.rows)
    results["memory"] = bench_memory(work, chunks)
    if not args.skip_spark:
        out.print(f"spark write: {args.spark_rows:,} rows ...")
        results["spark_write"] = bench_spark_write(
            work / "spark", args.spark_rows, args.spark_rounds, args.compression_level
        )
    path = save("handoff", results, folder=stack.home / "bench")
    plot(results["readers"], path.with_suffix(".png"))
    shutil.rmtree(work, ignore_errors=True)
    show(results)
    out.print(f"results: {path} and .png")


if __name__ == "__main__":
    main()
