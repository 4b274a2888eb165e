"""The live stage for thousands of micro-batches: does anything grow with the channel's age?

    flow bench soak                                  # 5,000 micro-batches
    flow bench soak --batches 300                    # a first look, and the time a batch takes
    flow bench soak --batches 1000 --rate 100 --trigger "0.5 seconds"

The CTR streaming pipeline's live stage (immediate labels, the in-plan writer: the path `flow
demo` takes), run by ``run_live`` in this process for ``--batches`` micro-batches on a short
trigger, while impressions go to Kafka at a steady ``--rate`` in real time (their clicks when
they come due) and a following reader, in a process of its own, reads the channel as a trainer
does and records its position, so that the stage's retention deletes what it has read. First,
in namespace ``soak`` (reset), a small history and the backfill: the feature state the live
stage needs.

Recorded per micro-batch, when the driver sees its progress: its duration; the driver's memory
(the JVM heap used, and every ``--gc-every`` batches used after a full collection; the JVM's
and this Python process's RSS); on disk, the channel's log (commit records, checkpoint,
segments, heads and sequence claims), its shards, Spark's checkpoint and the dead-letter table's
metadata. Per look of the follower for new commits: its time, storage requests, RSS.

Reported (benchmarks/_soak_report.py): the first 10 % of the batches against the last 10 %
(medians) and issue 43's targets (the last's median batch time at most 1.2x the first's; memory
flat), and the checks that hold whatever the timing: every impression produced reached the
follower exactly once, the counts reconcile, the log was compacted. Results go to
$FLOW_HOME/bench/soak-<time>.json and .png, and a table to stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _results import save, stamp
from _soak_follower import rss_bytes
from _soak_report import attach_polls, checks, plot, show, summarize
from pyarrow import fs as pafs
from pyspark.sql import SparkSession

from flow.config import StackConfig
from flow.console import console
from flow.errors import ConfigError
from flow.handoff import Channel
from flow.handoff.format import COMMITS, SHARDS, WRITERS
from flow.handoff.log import LOG, SEGMENTS, read_checkpoint
from flow.pipeline import BackfillStage, HandoffOutput, LiveStage, Pipeline, RunOptions
from flow.stack.iceberg import open_catalog
from flow.stack.kafka import delete_topics
from flow.storage import Location, location, namespace_locations
from flow.workflows.loading import produce_realtime, topics, write_history
from flow.workflows.streaming import Realtime, StreamReport
from flow.workflows.synthetic import SyntheticWorld
from pipelines.ctr_backfill import ctr_backfill
from pipelines.ctr_streaming import ctr_streaming
from spark_jobs.backfill import run_backfill
from spark_jobs.jvm import driver_memory
from spark_jobs.live import run_live
from spark_jobs.report import StageReport

NAMESPACE = "soak"
GROUP = "soak"
FOLLOWER = Path(__file__).resolve().with_name("_soak_follower.py")
MB = 2**20
out = console()


@dataclass(frozen=True)
class SoakConfig:
    """One soak run."""

    batches: int = 5000
    """Micro-batches while the stream runs (a few more follow while the stage catches up)."""
    rate: float = 50.0
    """Impressions a second, in real time; their clicks (~5 %) come on top."""
    trigger: str = "1 second"
    """The live stage's micro-batch interval: small batches, often."""
    gc_every: int = 0
    """A full collection of the driver's heap every this many batches, to read what it holds
    (a pause of the driver: not every batch); 0: five in each tenth of the run."""
    max_unconsumed_mb: float = 1024.0
    """The channel's bound (backpressure): what turns the stage's retention on; high enough
    that the follower never holds the stage back."""
    buckets: int = 64
    """The channel's buckets (HandoffOutput.num_buckets): a batch's rows are spread over as many
    shard files; the default is the pipeline's."""
    malformed_share: float = 0.01
    history_per_day: int = 5000
    """Impressions of the day of history the backfill fits the features on."""
    drain_s: float = 180.0
    """At most this long, after the stream stops, for the stage to read what was produced."""
    namespace: str = NAMESPACE

    def __post_init__(self) -> None:
        if self.batches < 10:
            raise ConfigError(f"--batches {self.batches}: give at least 10 (a tenth is compared)")
        if self.rate <= 0:
            raise ConfigError(f"--rate {self.rate}: give a positive number of impressions/s")
        if self.gc_every < 0:
            raise ConfigError(f"--gc-every {self.gc_every}: give 0 (automatic) or more")
        if self.max_unconsumed_mb <= 0:
            raise ConfigError(f"--max-unconsumed-mb {self.max_unconsumed_mb}: must be positive")

    @property
    def collect_every(self) -> int:
        # At least every other batch: a collection is a pause of the driver, ~0.5 s here.
        return self.gc_every or max(2, self.batches // 50)


# -- what is on disk ----------------------------------------------------------------------------


def tree_size(where: Location, *parts: str) -> tuple[int, int]:
    """Bytes and files under ``where``/``parts`` (0, 0 if it does not exist)."""
    path = "/".join([where.path, *parts])
    selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
    files = [i for i in where.fs.get_file_info(selector) if i.type == pafs.FileType.File]
    return sum(i.size or 0 for i in files), len(files)


@dataclass(frozen=True)
class Disk:
    """The folders a soak watches grow or not."""

    channel: Location
    checkpoint: Location
    """Spark's checkpoint of the live stage (offsets, commits, the join's state)."""
    ledger: Location | None
    """The dead-letter table's metadata folder: a snapshot a batch (the counts' ledger)."""

    def sizes(self) -> dict[str, float]:
        found: dict[str, float] = {}
        log_bytes = log_files = 0
        for part in (COMMITS, LOG, WRITERS):
            size, files = tree_size(self.channel, part)
            log_bytes, log_files = log_bytes + size, log_files + files
        found["log_bytes"], found["log_files"] = log_bytes, log_files
        found["records"] = tree_size(self.channel, COMMITS)[1]
        found["segments"] = tree_size(self.channel, LOG, SEGMENTS)[1]
        found["shards_bytes"], found["shard_files"] = tree_size(self.channel, SHARDS)
        found["spark_checkpoint_bytes"], found["spark_checkpoint_files"] = tree_size(
            self.checkpoint
        )
        if self.ledger is not None:
            found["ledger_metadata_bytes"], found["ledger_metadata_files"] = tree_size(self.ledger)
        return found


# -- the stream and the follower ----------------------------------------------------------------


class Stream:
    """Impressions at a steady rate, on a thread, until stopped (then what it sent)."""

    def __init__(self, stack: StackConfig, config: SoakConfig) -> None:
        self.stack, self.config = stack, config
        self.stopping = threading.Event()
        self.report: StreamReport | None = None
        self.error: BaseException | None = None
        self.stopped_at: float | None = None
        self.thread = threading.Thread(target=self._run, name="soak-stream", daemon=True)

    def _run(self) -> None:
        try:
            self.report = produce_realtime(
                self.stack,
                Realtime(rate=self.config.rate, malformed_share=self.config.malformed_share),
                namespace=self.config.namespace,
                stop=self.stopping.is_set,
            )
        except BaseException as error:  # said by the bench, which stops the stage
            self.error = error
        finally:
            self.stopped_at = time.monotonic()

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()

    @property
    def done(self) -> bool:
        return self.stopped_at is not None

    @property
    def records(self) -> int:
        """Kafka records sent (impressions and clicks): what the stage must read."""
        return 0 if self.report is None else self.report.impressions + self.report.clicks


class Follower:
    """benchmarks/_soak_follower.py in a process of its own, following the live channel."""

    def __init__(self, where: str, channel: str, folder: Path) -> None:
        self.result_path = folder / "follower.json"
        self.log_path = folder / "follower.log"
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(FOLLOWER), where, channel, str(self.result_path), "--group",
                 GROUP],
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    def result(self, timeout: float) -> dict[str, Any]:
        """What it read, once the channel's close has ended it."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise ConfigError(
                f"the follower did not end within {timeout:.0f}s of the channel's close; its "
                f"log: {self.log_path}"
            ) from None
        if self.process.returncode != 0 or not self.result_path.exists():
            tail = self.log_path.read_text()[-3000:]
            raise ConfigError(f"the follower failed (exit {self.process.returncode}):\n{tail}")
        result: dict[str, Any] = json.loads(self.result_path.read_text())
        return result

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


# -- the driver's side: a sample a micro-batch --------------------------------------------------


class Recorder:
    """``on_batch`` and ``stop`` of ``run_live``: a sample of each micro-batch; the stream stops
    after ``batches`` of them, and the stage once it has read every record the stream sent."""

    def __init__(
        self,
        spark: SparkSession,
        config: SoakConfig,
        disk: Disk,
        stream: Stream,
        say: Callable[[str], None],
        partial: Path | None = None,
    ) -> None:
        self.spark, self.config, self.disk, self.stream, self.say = (
            spark, config, disk, stream, say
        )  # fmt: skip
        self.partial = partial
        """Where the samples so far go every twentieth of the run: a run stopped early (hours
        in) leaves them."""
        self.samples: list[dict[str, float | None]] = []
        self.rows_in = 0
        self.started = time.monotonic()
        self.caught_up: bool | None = None
        """Whether the stage read every record sent before it stopped (None: not stopped)."""

    def on_batch(self, metrics: dict[str, float], batch_id: int) -> None:
        if "batch_duration_ms" not in metrics:  # a restart's count, not a batch
            self.say(f"the query restarted ({metrics})")
            return
        self.rows_in += int(metrics.get("batch_rows_in", 0))
        index = len(self.samples)
        collect = index % self.config.collect_every == 0
        took = time.perf_counter()
        memory = driver_memory(self.spark, collect=collect)
        took = time.perf_counter() - took
        sample: dict[str, float | None] = {
            "index": index,
            "batch": batch_id,
            "wall_time": time.time(),
            "duration_ms": metrics["batch_duration_ms"],
            "sink_ms": metrics.get("batch_sink_ms"),
            "rows_in": metrics.get("batch_rows_in"),
            "kafka_lag": metrics.get("kafka_lag_max"),
            "heap_used": memory.heap_used,
            "heap_after_gc": memory.heap_used if collect else None,
            "gc_s": took if collect else None,
            "non_heap_used": memory.non_heap_used,
            "jvm_rss": rss_bytes(memory.pid),
            "python_rss": rss_bytes(),
            **self.disk.sizes(),
            **_phases(self.spark, batch_id),
        }
        self.samples.append(sample)
        if index + 1 == self.config.batches:
            self.say(f"{index + 1:,} micro-batches: the stream stops; the stage catches up")
            self.stream.stop()
        elif (index + 1) % max(1, self.config.batches // 20) == 0:
            if self.partial is not None:
                self.partial.write_text(json.dumps(self.samples))
            elapsed = time.monotonic() - self.started
            self.say(
                f"{index + 1:,}/{self.config.batches:,} micro-batches in {elapsed:,.0f}s "
                f"({elapsed / (index + 1):.2f} s a batch); this one "
                f"{sample['duration_ms']:.0f} ms, log {int(sample['log_files'] or 0):,} files"
            )

    def stop(self) -> bool:
        stream = self.stream
        if stream.error is not None:
            self.caught_up = False
            return True
        if not stream.done:
            return False
        if self.rows_in >= stream.records:
            self.caught_up = True
            return True
        assert stream.stopped_at is not None
        if time.monotonic() - stream.stopped_at > self.config.drain_s:
            self.caught_up = False
            return True
        return False


def _phases(spark: SparkSession, batch_id: int) -> dict[str, float]:
    """The batch's phases as its progress times them (``ms_addBatch``: the writer's work,
    ``ms_queryPlanning``, ``ms_walCommit``, ...), from the query's recent progress."""
    for query in spark.streams.active:
        for progress in reversed(query.recentProgress):
            data = json.loads(progress.json)
            if int(data["batchId"]) == batch_id:
                return {f"ms_{k}": float(v) for k, v in data["durationMs"].items()}
    return {}


# -- the run ------------------------------------------------------------------------------------


def _reset(spark: SparkSession, stack: StackConfig, namespace: str) -> None:
    """Topics, checkpoints, channels, feature state and the dead-letter table of the namespace:
    a run starts with a channel, a log and a ledger of its own."""
    delete_topics(stack.kafka, topics(namespace).values())
    where = namespace_locations(stack, namespace)
    for folder in (where.checkpoints, where.handoff, where.feature_state):
        folder.remove()
    spark.sql(f"DROP TABLE IF EXISTS {stack.catalog.name}.{namespace}.dead_letters PURGE")


def prepare(
    spark: SparkSession, stack: StackConfig, config: SoakConfig, say: Callable[[str], None]
) -> Pipeline:
    """A fresh namespace with a day of history and the feature state fitted on it; the live
    pipeline, with its channel's retention on."""
    _reset(spark, stack, config.namespace)
    write_history(
        stack,
        SyntheticWorld(seed=43, users=2000, items=500),
        namespace=config.namespace,
        days=1,
        per_day=config.history_per_day,
        end=datetime.now(UTC) - timedelta(minutes=30),
    )
    backfill = ctr_backfill(config.namespace)
    stage = backfill.stage("backfill")
    assert isinstance(stage, BackfillStage)
    report, _ = run_backfill(spark, backfill, stage, stack)
    say(f"history and backfill: {report.training_rows:,} rows; the feature state fitted")
    live = ctr_streaming(config.namespace, trigger=config.trigger, label_strategy="immediate")
    bound = int(config.max_unconsumed_mb * MB)
    output = HandoffOutput(num_buckets=config.buckets, max_unconsumed_bytes=bound)
    return replace(live, output=output)


def _ledger_metadata(stack: StackConfig, namespace: str) -> Location | None:
    try:
        table = open_catalog(stack.catalog).load_table(f"{namespace}.dead_letters")
    except Exception:  # pyiceberg's NoSuchTableError: the stage makes it at its start
        return None
    return location(table.location(), stack.s3).child("metadata")


def soak(
    spark: SparkSession,
    stack: StackConfig,
    config: SoakConfig,
    say: Callable[[str], None],
    partial: Path | None = None,
) -> dict[str, Any]:
    """Prepare, run the stage with the stream and the follower, and gather what they did."""
    pipeline = prepare(spark, stack, config, say)
    stage = pipeline.stage("live")
    assert isinstance(stage, LiveStage)
    where = namespace_locations(stack, config.namespace)
    channel = Channel(where.handoff, stage.channel)
    disk = Disk(
        channel.folder,
        where.checkpoints.child(pipeline.name, stage.name),
        _ledger_metadata(stack, config.namespace),
    )
    stream = Stream(stack, config)
    recorder = Recorder(spark, config, disk, stream, say, partial)
    with tempfile.TemporaryDirectory(prefix="flow-soak-") as folder:
        follower = Follower(where.handoff.uri, stage.channel, Path(folder))
        try:
            stream.start()
            say(
                f"stream: {config.rate:g} impressions/s; the live stage on a {config.trigger} "
                f"trigger for {config.batches:,} micro-batches"
            )
            started = time.monotonic()
            report = run_live(
                spark,
                pipeline,
                stage,
                stack,
                RunOptions(mode="continuous"),
                progress=lambda line: say(f"stage: {line}"),
                on_batch=recorder.on_batch,
                stop=recorder.stop,
            )
            seconds = time.monotonic() - started
            stream.stop()
            stream.thread.join(timeout=60)
            channel.close()
            read = follower.result(timeout=300)
        finally:
            stream.stop()
            follower.kill()
    if stream.error is not None:
        raise ConfigError(f"the stream failed: {stream.error}") from stream.error
    assert stream.report is not None
    return {
        "config": asdict(config),
        "gc_every": config.collect_every,
        "seconds": seconds,
        "stream": _stream(stream.report),
        "stage": _stage(report),
        "caught_up": recorder.caught_up,
        "batches": recorder.samples,
        "follower": read,
        "checkpoint": _checkpoint(channel),
    }


def _stream(report: StreamReport) -> dict[str, Any]:
    return {
        "impressions": report.impressions,
        "malformed": sum(report.malformed.values()),
        "clicks": report.clicks,
        "valid_impressions": report.valid_impressions,
        "pending_clicks": report.pending_clicks,
        "seconds": report.seconds,
    }


def _stage(report: StageReport) -> dict[str, Any]:
    return {
        "events_input": report.events_input,
        "events_dead": report.events_dead,
        "duplicates": report.duplicates,
        "training_rows": report.training_rows,
        "positives": report.positives,
        "labels_input": report.labels_input,
        "labels_dead": report.labels_dead,
        "labels_unmatched": report.labels_unmatched,
        "pending": report.pending,
        "batches": report.batches,
        "reconciled": report.reconciled,
        "writer": report.tags.get("flow.live.writer", ""),
    }


def _checkpoint(channel: Channel) -> dict[str, Any]:
    """The channel's last checkpoint and what is left of its records and shards."""
    checkpoint = read_checkpoint(channel.folder)
    log = channel.log
    log.refresh()
    ids = log.ids()
    retired = -1 if checkpoint is None else checkpoint.retired_upto
    left = [int(n.removesuffix(".json")) for n in channel.folder.child(COMMITS).list(".json")]
    shard_batches = [int(n) for n in channel.folder.child(SHARDS).list(folders=True)]
    return {
        "exists": checkpoint is not None,
        "commits": len(ids),
        "folded": 0 if checkpoint is None else checkpoint.commits,
        "segments": 0 if checkpoint is None else len(checkpoint.segments),
        "retired_upto": retired,
        "retired_not_folded": sum(1 for b in ids if b <= retired and not log.folded(b)),
        "retired_records_left": sum(1 for b in left if b <= retired),
        "retired_shard_folders_left": sum(1 for b in shard_batches if b <= retired),
        "records_left": len(left),
        "committed_rows": log.rows(ids, None),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = SoakConfig()
    parser.add_argument("--batches", type=int, default=defaults.batches)
    parser.add_argument("--rate", type=float, default=defaults.rate, help="impressions/s")
    parser.add_argument("--trigger", default=defaults.trigger, help="micro-batch interval")
    parser.add_argument(
        "--gc-every",
        type=int,
        default=defaults.gc_every,
        help="a full collection of the driver's heap every N batches (0: 50 in the run)",
    )
    parser.add_argument("--max-unconsumed-mb", type=float, default=defaults.max_unconsumed_mb)
    parser.add_argument(
        "--buckets", type=int, default=defaults.buckets, help="the channel's buckets"
    )
    parser.add_argument("--drain", type=float, default=defaults.drain_s, help="seconds at most")
    args = parser.parse_args(argv)
    config = SoakConfig(
        batches=args.batches,
        rate=args.rate,
        trigger=args.trigger,
        gc_every=args.gc_every,
        max_unconsumed_mb=args.max_unconsumed_mb,
        buckets=args.buckets,
        drain_s=args.drain,
    )
    stack = StackConfig.from_env()
    from spark_jobs.session import get_session

    spark = get_session(stack, app_name="flow-bench-soak")
    begun = time.monotonic()

    def say(line: str) -> None:
        out.print(f"  {time.monotonic() - begun:7.0f}s {line}", highlight=False)

    folder = stack.home / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    at = stamp()
    partial = folder / f"soak-{at}.partial.json"
    result = report(soak(spark, stack, config, say, partial), config)
    path = save("soak", result, folder=folder, at=at, indent=1, default=_json_default)
    partial.unlink(missing_ok=True)
    picture = plot(result, path.with_suffix(".png"))
    show(result, out)
    out.print(f"results: {path}, plot: {picture}")


def report(result: dict[str, Any], config: SoakConfig) -> dict[str, Any]:
    """``result`` with its summary, its checks and the command; the follower's looks joined to
    the batches (and counted: a few an hour's look each is more than the JSON wants)."""
    polls = result["follower"].pop("polls")
    attach_polls(result["batches"], polls)
    result["follower"]["looks"] = len(polls)
    result["follower"]["idle_looks"] = sum(1 for p in polls if p[3])
    result["summary"] = summarize(result["batches"], config.batches)
    result["checks"] = checks(result)
    result["command"] = command(config)
    return result


def command(config: SoakConfig) -> str:
    """The ``flow bench soak`` command line that runs ``config`` again."""
    return (
        f"flow bench soak --batches {config.batches} --rate {config.rate:g} --trigger "
        f"'{config.trigger}' --gc-every {config.collect_every} --max-unconsumed-mb "
        f"{config.max_unconsumed_mb:g} --buckets {config.buckets}"
    )


def _json_default(value: object) -> object:
    if isinstance(value, float) and math.isnan(value):
        return None
    return str(value)


if __name__ == "__main__":
    main()
