"""The commit log at length: what a commit, a reader's start and a follower's poll cost.

    flow bench commits                          # 1k, 10k, 100k commits
    flow bench commits --commits 1000 10000 100000 1000000
    flow bench commits --store moto             # on a local S3-compatible server (moto's)
    flow bench commits --store s3://bucket/folder   # on your object store (FLOW_S3_* settings)

For each length a channel of 10-row commits (one bucket, one writer) is built directly as a
checkpoint of that many commits (segments as the log merges them; every commit names one shared
shard file, which is all a reader's first batch opens), then measured through the public API
on local disk or an object store (``--store``): ``add_commit`` (median of 50), a new reader's
time to its first batch, and a following reader's idle poll: its time and its filesystem
requests (a counting filesystem: what an object store bills). Prints a table; writes
$FLOW_HOME/bench/commits-<time>.png.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from _results import save

from flow.handoff import Channel, ChannelReader, Commit, ReadOptions
from flow.handoff import log as commit_log
from flow.handoff.format import WRITERS, WriterHead, head_name
from flow.storage import Location, counting_location, location

NEEDS_SERVICES = False
NEEDS_SPARK = False
WRITER = "bench:commits"
SCHEMA = pa.schema([("id", pa.int64())])


def build(root: str | Location, commits: int) -> Channel:
    """A channel whose checkpoint holds ``commits`` commits, written as the log would."""
    channel = Channel(root, "c")
    channel.create(SCHEMA, num_buckets=1)
    shard = channel.write_bucket(0, 0, pa.table({"id": np.arange(10)}), "t0")
    template = Commit("c", 0, (shard,), channel.meta().fingerprint, writer=WRITER)
    record = {k: v for k, v in json.loads(template.to_json()).items() if k != "shards"}
    segments = []
    step = 100_000
    for first in range(0, commits, step):
        n = min(step, commits - first)
        ids = np.arange(first, first + n, dtype=np.int64)
        texts = []
        for b in ids.tolist():
            record.update(batch_id=b, seq=b, previous=b - 1 if b else None, total_rows=10)
            texts.append(json.dumps(record))
        shard_struct = {
            "path": shard.path,
            "bucket": 0,
            "rows": 10,
            "bytes": shard.bytes,
            "checksum": shard.checksum,
        }
        table = pa.table(
            {
                "batch_id": ids,
                "writer": [WRITER] * n,
                "seq": ids,
                "previous": pa.array([b - 1 if b else None for b in ids.tolist()], pa.int64()),
                "total_rows": np.full(n, 10, dtype=np.int64),
                "shards": [[shard_struct]] * n,
                "record": texts,
            },
            schema=commit_log.SEGMENT_SCHEMA,
        )
        segments.append(commit_log._write_segment(channel.folder, table, 2 if n == step else 0))
    last = commits - 1
    checkpoint = commit_log.Checkpoint(
        tuple(segments), {WRITER: [last, last]}, commits, token="bench"
    )
    channel.folder.child(commit_log.LOG).write_bytes(
        commit_log.CHECKPOINT_FILE, checkpoint.to_json().encode()
    )
    head = WriterHead(WRITER, last, last)
    channel.folder.child(WRITERS).write_bytes(head_name(WRITER), head.to_json().encode())
    return channel


def measure(commits: int, store: Location | None) -> dict[str, Any]:
    """The figures of a channel of ``commits`` commits in a new folder of ``store`` (None: a
    local temporary folder)."""
    root: str | Location = (
        tempfile.mkdtemp(prefix="flow-bench-commits-")
        if store is None
        else store.child(f"commits-{commits}-{uuid.uuid4().hex[:8]}")
    )
    started = time.perf_counter()
    build(root, commits)
    built = time.perf_counter() - started
    counted, commit_calls = counting_location(root)
    channel = Channel(counted, "c")
    fingerprint = channel.meta().fingerprint
    times = []
    requests = 0
    for b in range(commits, commits + 50):
        shard = channel.write_bucket(b, 0, pa.table({"id": np.arange(10)}), "t0")
        before = commit_calls.total()
        t0 = time.perf_counter()
        channel.add_commit(Commit("c", b, (shard,), fingerprint, writer=WRITER))
        times.append(time.perf_counter() - t0)
        requests += commit_calls.total() - before
    t0 = time.perf_counter()
    reader = ChannelReader(root, "c", options=ReadOptions(batch_size=8, window_rows=64))
    next(iter(reader))
    first = time.perf_counter() - t0
    where, calls = counting_location(root)
    marks: list[tuple[float, int]] = []

    def pause(_: float) -> None:
        marks.append((time.perf_counter(), calls.total()))
        if len(marks) > 20:
            raise KeyboardInterrupt

    follower = ChannelReader(
        where,
        "c",
        options=ReadOptions(batch_size=8, window_rows=64, follow=True, after_commit=commits + 40),
        sleep=pause,
    )
    try:
        for _ in follower:
            pass
    except KeyboardInterrupt:
        pass
    polls = [marks[i + 1][0] - marks[i][0] for i in range(10, 20)]
    return {
        "commits": commits,
        "build_s": built,
        "add_commit_ms": statistics.median(times) * 1e3,
        "first_batch_s": first,
        "idle_poll_ms": statistics.median(polls) * 1e3,
        "requests_per_commit": requests / 50,
        "requests_per_poll": (marks[20][1] - marks[10][1]) / 10,
    }


def plot(results: list[dict[str, float]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r["commits"] for r in results]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    for ax, key, label in zip(
        axes,
        ("add_commit_ms", "first_batch_s", "idle_poll_ms"),
        ("add_commit (ms)", "new reader's first batch (s)", "idle poll (ms)"),
        strict=True,
    ):
        ax.plot(n, [r[key] for r in results], marker="o")
        ax.set_xscale("log")
        ax.set_xlabel("commits in the channel")
        ax.set_title(label)
    fig.tight_layout()
    fig.savefig(out)


@contextlib.contextmanager
def opened(store: str) -> Iterator[Location | None]:
    """Where to build the channels: ``local`` (None), ``moto`` (a local S3-compatible server,
    started for the run) or a URI."""
    if store == "local":
        yield None
        return
    if store != "moto":
        yield location(store)
        return
    from flow.stack.local_s3 import local_s3

    with local_s3(["bench"]) as port:
        options = f"endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
        yield location(f"s3://test:test@bench/commits?{options}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument(
        "--store",
        default="local",
        help="local (a temporary folder), moto (a local S3-compatible server) or a folder URI",
    )
    args = parser.parse_args()
    with opened(args.store) as store:
        results = run(args.commits, store)
    for r in results:
        r["store"] = args.store if store is None or args.store == "moto" else "uri"
    path = save("commits", results, indent=1)
    plot(results, path.with_suffix(".png"))
    print(f"results and plot: {path.with_suffix('')}.{{json,png}}")


def run(lengths: list[int], store: Location | None) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    print(
        f"{'commits':>9} {'add_commit':>11} {'req/commit':>10} {'first batch':>12} "
        f"{'idle poll':>10} {'req/poll':>9}"
    )
    for commits in lengths:
        r = measure(commits, store)
        results.append(r)
        print(
            f"{commits:>9,} {r['add_commit_ms']:>9.2f}ms {r['requests_per_commit']:>10.1f} "
            f"{r['first_batch_s']:>11.3f}s "
            f"{r['idle_poll_ms']:>8.2f}ms {r['requests_per_poll']:>9.1f}",
            flush=True,
        )
    return results


if __name__ == "__main__":
    main()
