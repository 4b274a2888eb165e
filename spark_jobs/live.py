"""A live stage: Kafka events, labelled by a stream-stream join, enriched, featurized, written.

One Structured Streaming query per stage, checkpointed under
``$FLOW_CHECKPOINTS/<namespace>/<pipeline>/<stage>/stream`` (``$FLOW_HOME/checkpoints`` on one
machine; on a cluster, storage every worker shares: S3 through Hadoop's S3A). Each micro-batch
hands its writer (spark_jobs.live_writers) every record it read, with its reason if it is bad,
beside the rows the label join emitted: so records are counted, malformed, out-of-range and late
ones dead-lettered with their reason and duplicates counted, in the same commit as the training
rows, and every count reconciles across restarts.

* **Event time.** A record whose event time is further than ``max_future`` ahead of (or
  ``max_past`` behind) the batch's processing time is a dead letter before any watermark sees
  it: one bad clock cannot move the watermark.
* **Watermark.** The query takes the smallest of its inputs' watermarks
  (``spark.sql.streaming.multipleWatermarkPolicy=min``, Spark's default): an impression is only
  called a negative once the label topic, too, has moved past its window. With the largest, a
  label topic ahead of the events (a backlog worked off in capped batches: the clicks of hours
  arrive in the first batch) made the events behind it late, and a silent label topic (its
  producer down) made every impression a negative. The price: a restarted query keeps its
  checkpointed watermark until every input has had data again (for CTR, the first click).
* **Supervision.** A query that fails is started again from its checkpoint, with backoff, up to
  ``RunOptions.max_restarts`` times (a broker outage of minutes, a topic not created yet, a task
  failure); each restart is one line and an MLflow metric, naming the root cause's class and
  message (spark_jobs.failures). Causes no restart mends are not retried: errors of the
  pipeline itself (FlowError), a full disk, a write refused. ``--duration`` counts from the
  first start, restarts included.

Every commit carries its writer and batch id, so a replayed batch writes nothing twice.

Where the stage allows it, the enrichment, features and shard writers are part of the query's
own plan and a micro-batch is one Spark job (spark_jobs.live_inplan); otherwise the writer
plans and runs them over each batch (spark_jobs.live_writers).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

from pyspark.errors import PySparkException, StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import MapType

from flow.config import StackConfig
from flow.errors import ConfigError, FlowError
from flow.pipeline.model import LiveStage, Pipeline
from flow.pipeline.run import RunOptions
from flow.pipeline.sources import PRODUCED_AT, KafkaSource
from flow.pipeline.state import FeatureState
from flow.storage import Location, namespace_locations
from spark_jobs.batch_facts import events_in_join
from spark_jobs.dimensions import Dimensions
from spark_jobs.failures import root_cause
from spark_jobs.features import Featurizer
from spark_jobs.joins import (
    deduplicated,
    enrichment_names,
    label_stream,
    label_stream_immediate,
)
from spark_jobs.jvm import JavaError, default_parallelism, launch_conf
from spark_jobs.live_inplan import DimensionsChangedError, InPlanWriter, unsupported
from spark_jobs.live_writers import KIND, StreamWriter, record_column
from spark_jobs.outputs import HandoffSink, TrainingSink, training_sink
from spark_jobs.report import StageReport
from spark_jobs.sinks import BatchLedger, writer_totals
from spark_jobs.sources import read_kafka
from spark_jobs.stage import Progress, StageRun
from spark_jobs.validate import REASON, barrier, parse_kafka, with_time_checks

__all__ = ["StreamFailedError", "run_live", "use_state_store"]

OnBatch = Callable[[dict[str, float], int], None]


TRACK_STATE_ROWS = "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows"
STATE_STORES: dict[str, dict[str, str]] = {
    "rocksdb": {
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # One budget (500 MB by default) for every RocksDB instance of the process: a store per
        # partition and operator side, each with its own write buffers otherwise.
        "spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage": "true",
        # Spark's running count of the rows in state costs a read before every write: 1.2 ->
        # 0.75 s of CPU per task of the stateful stage, a batch of 50,000 on 2 cores. The report
        # reads the label join's state from the checkpoint instead (spark_jobs.batch_facts).
        TRACK_STATE_ROWS: "false",
    },
    "memory": {
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
        ),
    },
}
"""Spark's settings for each LiveStage.state_store; a new checkpoint records them, an existing
one keeps those it was made with (Spark reads them back from its offset log)."""


def use_state_store(spark: SparkSession, state_store: str) -> None:
    """Name ``state_store`` (a key of :data:`STATE_STORES`) on the session, for the queries whose
    checkpoints are made after this."""
    for key, value in STATE_STORES[state_store].items():
        spark.conf.set(key, value)


def _spark_counts_state(state_store: str) -> bool:
    """Whether the query's progress counts the rows in state (``numRowsTotal``)."""
    return STATE_STORES[state_store].get(TRACK_STATE_ROWS, "true") == "true"


class StreamFailedError(FlowError):
    """A streaming query of a live stage stopped with an error."""

    def __init__(
        self, message: str, *, cause: str = "", transient: bool = True, remedy: str = ""
    ) -> None:
        super().__init__(message)
        self.cause = cause or message
        """The root cause in one line: its class and message."""
        self.transient = transient
        """Worth a restart: not a cause that any restart meets again (a full disk, a refused
        write, an error of the pipeline itself)."""
        self.remedy = remedy
        """What to change, for a cause that is not transient."""
        self.refresh = False
        """Not a failure: the query stopped to start again with changed dimension tables
        (spark_jobs.live_inplan)."""

    @classmethod
    def of(cls, query: str, error: str, recorded: BaseException | None = None) -> StreamFailedError:
        """From a query's exception text and, where the batch function raised it on the
        driver, the exception itself (``recorded``): the root cause, by its class."""
        root = root_cause(recorded, error)
        if root is not None:
            cause, transient, remedy = str(root), root.transient, root.remedy
        else:  # no exception class in it: Spark's first line after its preamble
            text = error.split("terminated with exception:", 1)[-1].strip()
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            cause, transient, remedy = (lines[0] if lines else text)[:400], True, ""
        failed = cls(
            f"the {query} query failed: {cause}", cause=cause, transient=transient, remedy=remedy
        )
        failed.refresh = isinstance(recorded, DimensionsChangedError) or (
            DimensionsChangedError.__name__ in error
        )
        return failed


def _kafka(pipeline: Pipeline, name: str) -> KafkaSource:
    source = pipeline.sources[name]
    if not isinstance(source, KafkaSource):
        raise ConfigError(f"source {name!r} is not a Kafka topic; a live stage reads Kafka")
    return source


def _read_once(parsed: DataFrame) -> DataFrame:
    """``parsed`` behind one exchange, so that a topic is read from Kafka and parsed once.

    The stage's plan uses a topic's parsed records twice: every record for the accounting, the
    valid ones for the join. Spark plans each use as a scan and parse of its own; here both end
    in an identical exchange, which Spark runs once and reuses (``ReusedExchange``;
    ``spark.sql.exchange.reuse``, on by default). Identical takes two things: the exchange
    hashes every column, so column pruning can push no branch's projection below it, and the
    valid records' filter above it is not deterministic (``_valid``), so it is not pushed
    below it either. The records are shuffled once more than before; that costs less than the
    second read and parse it saves (~0.6 s of a 7-8 s batch of 50,000 impressions on 2 cores,
    docs/experiments/2026-11-24-live-stage-rate.md). Which partition a record lands in
    matters to nobody: the deduplication and the join shuffle by key again.
    """
    # Spark hashes no map: a map-typed field (none of the declared types is one today) would
    # only cost the reuse (its branch's exchange pruned apart), not the query.
    every = [F.col(f.name) for f in parsed.schema.fields if not isinstance(f.dataType, MapType)]
    # spark_partition_id(): the input partition (hence deterministic for a task, retried or
    # not), and not deterministic to the optimizer, which keeps the exchange as written.
    return parsed.repartition(F.xxhash64(*every, F.spark_partition_id()))


def _reader_options(source: KafkaSource) -> dict[str, str]:
    if source.max_records_per_batch is None:
        return {}
    return {"maxOffsetsPerTrigger": str(source.max_records_per_batch)}


def _writer_id(
    checkpoint: Location, pipeline: Pipeline, stage: LiveStage, marker: str = "writer-id"
) -> str:
    """Names this stage's checkpoint incarnation: a deleted checkpoint starts a new writer, whose
    batch ids (from 0 again) are not mistaken for ones already committed."""
    if not checkpoint.exists(marker):
        checkpoint.write_bytes(marker, uuid.uuid4().hex[:12].encode())
    return f"{pipeline.name}.{stage.name}:{checkpoint.read_bytes(marker).decode().strip()}"


@dataclass
class _Watch:
    """What the query's progress said during this run (and across its restarts)."""

    seen: set[str] = field(default_factory=set)
    records_read: dict[int, int] = field(default_factory=dict)
    """Kafka records each batch read, by batch id, as its writer counted them (Spark's
    ``numInputRows`` counts a topic once per scan in the plan: once since ``_read_once``, but
    twice with ``spark.sql.exchange.reuse`` off)."""
    rows_in: int = 0
    state_rows: int | None = None
    """Rows in the query's state after its last batch, as its progress says (None when the
    state store does not count them: _spark_counts_state)."""
    counts_state: bool = True
    batches: int = 0
    restarts: int = 0
    last_batch: int = 0
    batch_error: BaseException | None = None
    """What the batch function raised last, as the driver caught it: the exception itself,
    whose class Spark's text of it (a traceback) only names."""


_LAG_METRICS = {
    "kafka_lag_max": "maxOffsetsBehindLatest",
    "kafka_lag_avg": "avgOffsetsBehindLatest",
}


def _kafka_lag(progress: dict[str, Any]) -> dict[str, float]:
    """Offsets the batch's Kafka sources were behind the latest, as Spark's Kafka source reports
    them per partition (max and mean over partitions; the worst topic wins)."""
    found: dict[str, float] = {}
    for source in progress.get("sources") or []:
        metrics = source.get("metrics") or {}
        for name, key in _LAG_METRICS.items():
            if key in metrics:
                found[name] = max(found.get(name, 0.0), float(metrics[key]))
    return found


def _poll(query: StreamingQuery, watch: _Watch, on_batch: OnBatch) -> None:
    for progress in query.recentProgress:
        data: dict[str, Any] = json.loads(progress.json)
        key = f"{data['runId'] if 'runId' in data else data['id']}:{data['batchId']}"
        if key in watch.seen:
            continue
        watch.seen.add(key)
        scanned = int(data["numInputRows"])
        # A batch the writer skipped (a replay) has no count of its own: Spark's is used.
        rows = watch.records_read.pop(int(data["batchId"]), scanned)
        operators = data.get("stateOperators") or []
        watch.rows_in += rows
        if operators and watch.counts_state:
            watch.state_rows = sum(int(o["numRowsTotal"]) for o in operators)
        watch.batches += 1
        watch.last_batch = int(data["batchId"])
        on_batch(
            {
                "batch_rows_in": float(rows),
                # Spark's count, once per scan of a topic in the plan: above batch_rows_in, a
                # topic was read more than once (the exchange _read_once sets up not reused).
                "batch_rows_scanned": float(scanned),
                "batch_input_rows_per_s": float(data.get("inputRowsPerSecond") or 0.0),
                "batch_processed_rows_per_s": float(data.get("processedRowsPerSecond") or 0.0),
                "batch_duration_ms": float(data["durationMs"].get("triggerExecution", 0)),
                # addBatch is the foreachBatch sink; the rest is reading, state and commits.
                "batch_sink_ms": float(data["durationMs"].get("addBatch", 0)),
                **({} if watch.state_rows is None else {"state_rows": float(watch.state_rows)}),
                **_kafka_lag(data),
            },
            int(data["batchId"]),
        )


def _failure(query: StreamingQuery, watch: _Watch) -> StreamFailedError | None:
    error = query.exception()
    if error is None:
        return None
    return StreamFailedError.of(query.name or "stream", str(error), watch.batch_error)


def _await(
    query: StreamingQuery,
    options: RunOptions,
    watch: _Watch,
    on_batch: OnBatch,
    progress: Progress,
    stop: Callable[[], bool],
    deadline: float | None = None,
) -> None:
    """Wait on ``query`` until it ends, fails, ``stop()`` or ``deadline`` (monotonic; from
    ``options.duration_s`` from now if not given)."""
    if deadline is None and options.duration_s is not None:
        deadline = time.monotonic() + options.duration_s
    try:
        while query.isActive:
            failed = _failure(query, watch)
            if failed is not None:
                _poll(query, watch, on_batch)  # the batches it finished before failing
                raise failed
            try:
                query.awaitTermination(2)
            except StreamingQueryException as error:  # it failed while we waited
                _poll(query, watch, on_batch)
                raise StreamFailedError.of(
                    query.name or "stream", str(error), watch.batch_error
                ) from None
            _poll(query, watch, on_batch)
            if deadline is not None and time.monotonic() > deadline:
                progress(f"duration of {options.duration_s:.0f}s reached; stopping the query")
                _stop_between_batches(query)
                break
            if stop():
                progress("asked to stop; stopping the query")
                _stop_between_batches(query)
                break
    finally:
        if query.isActive:
            query.stop()
    _poll(query, watch, on_batch)
    failed = _failure(query, watch)
    if failed is not None:
        raise failed


def _recording(
    writer: Callable[[DataFrame, int], None], watch: _Watch
) -> Callable[[DataFrame, int], None]:
    """``writer`` as the query's batch function, keeping what it raises in ``watch``: Spark
    passes on only its text, the class that classifies it (spark_jobs.failures) stays here."""

    def batch(frame: DataFrame, batch_id: int) -> None:
        try:
            writer(frame, batch_id)
        except BaseException as exc:
            watch.batch_error = exc
            raise

    return batch


def _stop_between_batches(query: StreamingQuery, patience_s: float = 60.0) -> None:
    """Stop the query once its running micro-batch (if any) is done.

    ``stop()`` interrupts a batch wherever it is, possibly between its training commit and the
    commit of its counts (LiveRun.count reports such a batch apart; the next run replays it).
    Between batches there is nothing to interrupt; a query that falls behind its trigger starts
    the next batch at once, so this lowers the odds rather than rule it out.
    """
    deadline = time.monotonic() + patience_s
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.1)
    query.stop()


def backoff_s(attempt: int) -> float:
    """Seconds before restart ``attempt`` (1, 2, ...): doubling from 2 s, at most a minute."""
    return float(min(60, 2**attempt))


QUERY = "stream"
"""The name of a live stage's query folder in its checkpoint (one query since the intake and
main queries were merged: a checkpoint of the two-query layout is not reused)."""


@dataclass(frozen=True)
class _Outputs:
    """Where a live run writes, and under which writer id its commits are found again."""

    checkpoint: Location
    """The query's checkpoint folder (shared storage on a cluster: FLOW_CHECKPOINTS)."""
    writer: str
    training: TrainingSink
    dead_letters: str


class LiveRun(StageRun[LiveStage]):
    """One run of a live stage, its phases in the order ``run`` lists them.

    What the query does per micro-batch is in :mod:`spark_jobs.live_writers`; waiting on the
    query, reading its progress and restarting it are ``_await``, ``_poll`` and ``supervise``.
    """

    def __init__(
        self,
        spark: SparkSession,
        pipeline: Pipeline,
        stage: LiveStage,
        stack: StackConfig,
        options: RunOptions,
        progress: Progress,
        on_batch: OnBatch,
        stop: Callable[[], bool],
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(spark, stack, pipeline, stage, "live", progress)
        self.options, self.on_batch, self.stop, self.sleep = options, on_batch, stop, sleep
        self.events = _kafka(pipeline, stage.events)
        self.labels = (stage.label, _kafka(pipeline, stage.label.source)) if stage.label else None
        self.query_name = f"{pipeline.name}.{stage.name}"

    @property
    def sources(self) -> list[tuple[str, KafkaSource]]:
        """The topics the stage reads, by source name: events, then labels."""
        found = [(self.stage.events, self.events)]
        if self.labels is not None:
            found.append((self.labels[0].source, self.labels[1]))
        return found

    def run(self) -> StageReport:
        self.check_outputs()
        state = self.feature_state()
        outputs = self.open_outputs(state)
        dimensions = Dimensions(self.spark, self.stack, self.pipeline)
        writer = self.writer(outputs, state, dimensions)
        topics = ", ".join(s.topic for _, s in self.sources)
        self.progress(f"{self.stage.name}: streaming {topics} ({self.options.mode})")
        watch = _Watch(
            records_read=writer.records_read,
            counts_state=_spark_counts_state(self.stage.state_store),
        )
        try:
            self.supervise(outputs.checkpoint, writer, watch)
        finally:
            if isinstance(writer, InPlanWriter):
                writer.release()
            dimensions.release()
        return self.count(outputs, watch, writer.ledger.last)

    def feature_state(self) -> FeatureState:
        """The fitted state the backfill saved; a spec with nothing to fit needs none saved."""
        spec = self.stage.features
        if spec.needs_fit:
            return self.load_state(self.options.feature_state)
        state = FeatureState(spec.name, spec.fingerprint)
        self.report.feature_state = state.version
        return state

    def open_outputs(self, state: FeatureState) -> _Outputs:
        """The checkpoint and its writer id, the training sink and the dead-letter table."""
        pipeline, stage = self.pipeline, self.stage
        where = namespace_locations(self.stack, pipeline.namespace).checkpoints
        folder = where.child(pipeline.name, stage.name)
        writer = _writer_id(folder, pipeline, stage, marker=f"{QUERY}-writer-id")
        self.report.lineage["writer"] = writer
        if stage.label is not None:  # an MLflow tag: which labels the channel's rows carry
            self.report.lineage["label_strategy"] = stage.label.strategy
        checkpoint = folder.child(QUERY)
        training = training_sink(
            self.spark,
            self.stack,
            pipeline,
            stage,
            state,
            writer=writer,
            event_time=self.events.event_time,
            checkpoint=checkpoint,
        )
        self.report.table = training.where
        self.ensure_namespace()
        return _Outputs(checkpoint, writer, training, self.open_dead_letters())

    def writer(
        self, outputs: _Outputs, state: FeatureState, dimensions: Dimensions
    ) -> StreamWriter | InPlanWriter:
        """The query's per-batch writer: the writes inside the streaming plan where the stage
        allows it (spark_jobs.live_inplan), else a writer of its own per batch."""
        parts: dict[str, Any] = {
            "query_name": self.query_name,
            "checkpoint": outputs.checkpoint,
            "ledger": BatchLedger(self.spark, outputs.dead_letters, outputs.writer),
            "featurizer": Featurizer(self.spark, self.stage.features, state),
            "dimensions": dimensions,
        }
        common = (self.spark, self.stage, self.pipeline.name, self.sources)
        training = outputs.training
        if unsupported(self.pipeline, self.stage, self.events) is None and isinstance(
            training, HandoffSink
        ):
            return InPlanWriter(*common, training=training, progress=self.progress, **parts)
        return StreamWriter(*common, training=training, **parts)

    def _parsed(self, name: str, source: KafkaSource) -> DataFrame:
        raw = read_kafka(
            self.spark,
            self.stack.kafka,
            [source.topic],
            starting_offsets=source.starting_offsets,
            options=_reader_options(source),
        )
        return parse_kafka(raw, source, name, timed=False)

    def stream_frame(self, writer: StreamWriter | InPlanWriter | None = None) -> DataFrame:
        """Every record read (dead-letter layout, reason, event time) beside the joined rows
        (or, with the writes in the plan, what the writer tasks wrote of them)."""
        parsed = {
            name: with_time_checks(_read_once(self._parsed(name, source)), source)
            for name, source in self.sources
        }
        records = reduce(
            DataFrame.unionByName,
            [parsed[n].select(record_column(s.event_time)) for n, s in self.sources],
        ).withColumn(KIND, F.lit("record"))
        if isinstance(writer, InPlanWriter):
            counted = {name: writer.counted(frame, name) for name, frame in parsed.items()}
            rows = writer.rows(self.labelled_frame(parsed, counted), self.events)
        else:
            rows = self.labelled_frame(parsed).withColumn(KIND, F.lit("row"))
        return rows.unionByName(records, allowMissingColumns=True)

    def _valid(self, parsed: DataFrame, source: KafkaSource) -> DataFrame:
        """A source's valid records as its fields, and when each was produced (PRODUCED_AT).
        The filter is a barrier: pushed below ``_read_once``'s exchange, it would make this
        branch's exchange differ from the records' one, and the topic be read twice."""
        valid = parsed.where(barrier(F.col(REASON) == ""))
        names = [f.name for f in source.fields]
        produced = [] if PRODUCED_AT in names else [F.col("kafka_timestamp").alias(PRODUCED_AT)]
        return valid.select(*names, *produced)

    def labelled_frame(
        self, parsed: dict[str, DataFrame], counted: dict[str, DataFrame] | None = None
    ) -> DataFrame:
        """The valid events, deduplicated by their key and joined in the stream with their
        labels (watermarked) if any. ``counted``: the sources' records as the join reads them
        (observed), if not ``parsed``."""
        parsed = counted or parsed
        events = self.events
        rows = self._valid(parsed[self.stage.events], events)
        key = events.key or (self.labels[0].key if self.labels is not None else None)
        if self.labels is None:
            return deduplicated(rows, events.event_time, events.watermark, key) if key else rows
        label, source = self.labels
        join = label_stream_immediate if label.strategy == "immediate" else label_stream
        return join(
            rows,
            self._valid(parsed[label.source], source),
            label,
            events.event_time,
            events.watermark,
            source.event_time,
            source.watermark,
            event_key=key,
        )

    def start(
        self, checkpoint: Location, writer: StreamWriter | InPlanWriter, watch: _Watch
    ) -> StreamingQuery:
        # The smallest input watermark wins (see the module docstring), whatever the session
        # says; recorded in a new checkpoint (one made before keeps the policy it was made with).
        self.spark.conf.set("spark.sql.streaming.multipleWatermarkPolicy", "min")
        use_state_store(self.spark, self.stage.state_store)
        partitions = self.partitions()
        if partitions is not None:
            self.spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
        stream = (
            self.stream_frame(writer)
            .writeStream.queryName(self.query_name)
            .foreachBatch(_recording(writer, watch))
            .option("checkpointLocation", checkpoint.hadoop_uri)
        )
        if self.options.mode == "continuous":
            stream = stream.trigger(processingTime=self.stage.trigger)
        else:
            stream = stream.trigger(availableNow=True)
        return stream.start()

    def partitions(self) -> int | None:
        """Shuffle (and so state-store) partitions for a new checkpoint: the stage's setting,
        else a ``spark.sql.shuffle.partitions`` launched with (the local session's is one per
        core: spark_jobs.conf) is kept, else the cluster's cores. Never Spark's 200: a stateful
        stage commits a state store per partition and operator every micro-batch, which on a
        one-core worker made batches of seconds take minutes."""
        if self.stage.partitions is not None:
            return self.stage.partitions
        if launch_conf(self.spark).contains("spark.sql.shuffle.partitions"):
            return None
        return max(2, default_parallelism(self.spark))

    def supervise(
        self, checkpoint: Location, writer: StreamWriter | InPlanWriter, watch: _Watch
    ) -> None:
        """Run the query; when it fails, start it again from its checkpoint after a pause, up
        to ``max_restarts`` times. An error of the pipeline itself is raised at once."""
        limit, name = self.options.max_restarts, self.stage.name
        duration = self.options.duration_s
        # From the first start: restarts spend the duration, they do not renew it.
        deadline = None if duration is None else time.monotonic() + duration
        while True:
            watch.batch_error = None
            query = self.start(checkpoint, writer, watch)
            try:
                _await(
                    query, self.options, watch, self.on_batch, self.progress, self.stop, deadline
                )
                return
            except StreamFailedError as failure:
                if failure.refresh:
                    self.progress(
                        f"{name}: a dimension table changed; the query starts again "
                        "from its checkpoint to read it"
                    )
                    continue
                if not failure.transient:
                    why = f" ({failure.remedy})" if failure.remedy else ""
                    raise StreamFailedError(
                        f"live stage {name!r} stopped, not restarted: {failure.cause}{why}",
                        cause=failure.cause,
                        transient=False,
                        remedy=failure.remedy,
                    ) from failure
                if watch.restarts >= limit:
                    raise StreamFailedError(
                        f"live stage {name!r} gave up after {watch.restarts} "
                        f"restart(s) (--max-restarts {limit}): {failure.cause}",
                        cause=failure.cause,
                        transient=False,
                    ) from failure
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise StreamFailedError(
                        f"live stage {name!r} failed as its --duration of {duration:.0f}s "
                        f"ran out, after {watch.restarts} restart(s): {failure.cause}",
                        cause=failure.cause,
                        transient=False,
                    ) from failure
                watch.restarts += 1
                pause = backoff_s(watch.restarts)
                if left is not None:
                    pause = min(pause, left)
                self.progress(
                    f"{name}: the query failed ({failure.cause}); restart "
                    f"{watch.restarts}/{limit} from its checkpoint in {pause:.0f}s"
                )
                self.on_batch({"restarts": float(watch.restarts)}, watch.last_batch)
                self.sleep(pause)

    def events_in_join(self, checkpoint: Location, batch_id: int) -> int | None:
        """The events the label join holds after ``batch_id``, or None (and said) if its state
        cannot be read back: then what is pending is not checked against it."""
        try:
            return events_in_join(self.spark, checkpoint, batch_id)
        except (PySparkException, JavaError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            self.progress(
                f"{self.stage.name}: the label join's state in {checkpoint} could not be read "
                f"({first}); the events pending in it are not checked"
            )
            return None

    def count(self, outputs: _Outputs, watch: _Watch, ledger_last: int) -> StageReport:
        """The report: counts read back from the tables' commits (they hold across restarts),
        and what the query's progress said during this run."""
        report, stage = self.report, self.stage
        # A batch's two commits (its training rows; its counts and dead letters) are made side
        # by side: a batch stopped between them is counted by neither here (and said), so what
        # is reported reconciles; the next run replays it and makes the missing commit.
        counted = min(ledger_last, outputs.training.last)
        ledger = writer_totals(self.spark, outputs.dead_letters, outputs.writer, upto=counted)
        report.training_rows, report.positives = outputs.training.totals(upto=counted)
        ahead = max(outputs.training.last, ledger_last)
        if ahead > counted:
            self.progress(
                f"{stage.name}: batch {ahead} was stopped after one of its two commits; the "
                "next run replays it and makes the other (its counts are left out until then)"
            )

        def outcome(kind: str, source: str) -> int:
            return int(ledger[f"flow.{kind}.{source}"])

        events = stage.events
        report.events_input = outcome("input", events)
        late = outcome("late", events)
        report.events_dead = outcome("invalid", events) + late + outcome("unusable", events)
        report.duplicates = outcome("duplicates", events)
        report.dimension_misses = {
            name: int(ledger[f"flow.missing.{name}"]) for name in enrichment_names(stage.enrich)
        }
        if stage.label:
            labels = stage.label.source
            report.labels_input = outcome("input", labels)
            report.labels_dead = outcome("invalid", labels) + outcome("late", labels)
            late += outcome("late", labels)
        immediate = stage.label is not None and stage.label.strategy == "immediate"
        if immediate:  # each positive is an event's second row: its first left as a negative
            report.relabelled = report.positives
        report.pending = (
            report.events_input
            - report.events_dead
            - report.duplicates
            - (report.training_rows - report.relabelled)
        )
        in_join: int | None = None
        if not stage.label or immediate:
            report.pending_bound = 0  # nothing waits for a window
        elif counted >= 0:
            in_join = report.pending_bound = self.events_in_join(outputs.checkpoint, counted)
        report.batches = watch.batches
        report.extra = {
            "run_rows_in": float(watch.rows_in),
            "late": float(late),
            "late_by_operators": float(ledger["flow.operators_late"]),
            "duplicates": float(report.duplicates),
            "restarts": float(watch.restarts),
        }
        if watch.state_rows is not None:
            report.extra["state_rows"] = float(watch.state_rows)
        if in_join is not None:
            report.extra["events_in_join"] = float(in_join)
        waiting = (
            f"{report.relabelled:,} emitted again as positives (immediate labels)"
            if immediate
            else f"{report.pending:,} pending in the label window"
        )
        # Every dead letter, the labels' too: the figure the stage table's column shows.
        dead = report.events_dead + report.labels_dead
        return self.finish(
            f"{stage.name}: {report.training_rows:,} training rows, {dead:,} dead "
            f"letters ({late:,} late), {report.duplicates:,} duplicates, {waiting} (since the "
            f"checkpoint began){report.said_missing()}"
        )


def run_live(
    spark: SparkSession,
    pipeline: Pipeline,
    stage: LiveStage,
    stack: StackConfig,
    options: RunOptions,
    *,
    progress: Progress = lambda _: None,
    on_batch: OnBatch = lambda _m, _s: None,
    stop: Callable[[], bool] = lambda: False,
) -> StageReport:
    """Run the stage until caught up (available-now) or until ``duration`` or ``stop()``."""
    return LiveRun(spark, pipeline, stage, stack, options, progress, on_batch, stop).run()
