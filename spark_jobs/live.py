"""A live stage: Kafka events, labelled by a stream-stream join, enriched, featurized, written.

Two Structured Streaming queries run side by side, each with its own checkpoint under
``$FLOW_HOME/checkpoints/<pipeline>/<stage>/``:

* **intake** reads every record of the stage's topics, writes the malformed ones to the dead-letter
  table with their reason, and records how many records of each source it read in that commit;
* **main** parses the valid records, runs the label join (watermarked), then per micro-batch
  enriches with freshly read dimension tables, featurizes and appends the training rows.

Every commit carries its writer and batch id, so a replayed batch writes nothing twice, and the
counts the report reconciles are read back from the tables: they hold across restarts.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from flow.config import StackConfig
from flow.errors import ConfigError, FlowError
from flow.pipeline.model import LiveStage, Pipeline
from flow.pipeline.run import RunOptions
from flow.pipeline.sources import DeltaSource, IcebergSource, KafkaSource
from flow.pipeline.state import FeatureState, states_location
from flow.stack.iceberg import open_catalog
from spark_jobs.features import Featurizer
from spark_jobs.joins import enrich, label_stream
from spark_jobs.outputs import training_sink
from spark_jobs.report import StageReport
from spark_jobs.rows import dead_letter_table, split_unusable
from spark_jobs.sinks import (
    DEAD_LETTER_SCHEMA,
    BatchLedger,
    dead_letter_rows,
    ensure_table,
    writer_totals,
)
from spark_jobs.sources import read_kafka, read_table
from spark_jobs.validate import DEAD_LETTER_COLUMNS, REASON, parse_kafka

__all__ = ["StreamFailedError", "run_live"]

Progress = Callable[[str], None]
OnBatch = Callable[[dict[str, float], int], None]


class StreamFailedError(FlowError):
    """A streaming query of a live stage stopped with an error."""


def _kafka(pipeline: Pipeline, name: str) -> KafkaSource:
    source = pipeline.sources[name]
    if not isinstance(source, KafkaSource):
        raise ConfigError(f"source {name!r} is not a Kafka topic; a live stage reads Kafka")
    return source


def _reader_options(source: KafkaSource) -> dict[str, str]:
    if source.max_records_per_batch is None:
        return {}
    return {"maxOffsetsPerTrigger": str(source.max_records_per_batch)}


def _writer_id(checkpoint: Path, pipeline: Pipeline, stage: LiveStage) -> str:
    """Names this stage's checkpoint incarnation: a deleted checkpoint starts a new writer, whose
    batch ids (from 0 again) are not mistaken for ones already committed."""
    marker = checkpoint / "writer-id"
    if not marker.exists():
        checkpoint.mkdir(parents=True, exist_ok=True)
        marker.write_text(uuid.uuid4().hex[:12])
    return f"{pipeline.name}.{stage.name}:{marker.read_text().strip()}"


@dataclass
class _Watch:
    """What the queries' progress said during this run."""

    seen: set[tuple[str, str]] = field(default_factory=set)
    rows_in: int = 0
    late_dropped: int = 0
    state_rows: int | None = None
    batches: int = 0


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


def _poll(queries: dict[str, StreamingQuery], watch: _Watch, on_batch: OnBatch) -> None:
    for role, query in queries.items():
        for progress in query.recentProgress:
            data: dict[str, Any] = json.loads(progress.json)
            key = (role, f"{data['id']}:{data['batchId']}")
            if key in watch.seen:
                continue
            watch.seen.add(key)
            if role != "main":
                continue
            rows = int(data["numInputRows"])
            operators = data.get("stateOperators") or []
            watch.rows_in += rows
            watch.late_dropped += sum(int(o.get("numRowsDroppedByWatermark", 0)) for o in operators)
            if operators:
                watch.state_rows = sum(int(o["numRowsTotal"]) for o in operators)
            watch.batches += 1
            on_batch(
                {
                    "batch_rows_in": float(rows),
                    "batch_input_rows_per_s": float(data.get("inputRowsPerSecond") or 0.0),
                    "batch_processed_rows_per_s": float(data.get("processedRowsPerSecond") or 0.0),
                    "batch_duration_ms": float(data["durationMs"].get("triggerExecution", 0)),
                    # addBatch is the foreachBatch sink; the rest is reading, state and commits.
                    "batch_sink_ms": float(data["durationMs"].get("addBatch", 0)),
                    "state_rows": float(watch.state_rows or 0),
                    **_kafka_lag(data),
                },
                int(data["batchId"]),
            )


def _await(
    queries: dict[str, StreamingQuery],
    options: RunOptions,
    watch: _Watch,
    on_batch: OnBatch,
    progress: Progress,
    stop: Callable[[], bool],
) -> None:
    deadline = time.monotonic() + options.duration_s if options.duration_s is not None else None
    try:
        while any(q.isActive for q in queries.values()):
            for role, query in queries.items():
                if query.exception() is not None:
                    raise StreamFailedError(f"the {role} query failed: {query.exception()}")
            next(iter(queries.values())).awaitTermination(2)
            _poll(queries, watch, on_batch)
            if deadline is not None and time.monotonic() > deadline:
                progress(f"duration of {options.duration_s:.0f}s reached; stopping the queries")
                break
            if stop():
                progress("asked to stop; stopping the queries")
                break
    finally:
        for query in queries.values():
            if query.isActive:
                query.stop()
    for role, query in queries.items():
        if query.exception() is not None:
            raise StreamFailedError(f"the {role} query failed: {query.exception()}")
    _poll(queries, watch, on_batch)


class _Dimensions:
    """Dimension tables for enrichment, re-read whenever they change.

    Each micro-batch asks an Iceberg table's catalog for its current snapshot (one small read
    through pyiceberg, not a Spark job); the rows are scanned again only when it changed, so an
    update is seen at the next batch and an unchanged table costs no scan. Delta tables are
    read every batch.
    """

    def __init__(self, spark: SparkSession, stack: StackConfig, pipeline: Pipeline) -> None:
        self.spark, self.stack, self.pipeline = spark, stack, pipeline
        self._catalog = open_catalog(stack.catalog)
        self._cached: dict[str, tuple[int, DataFrame]] = {}

    def _current(self, source: IcebergSource) -> int | None:
        snapshot = self._catalog.load_table(source.table).current_snapshot()
        return snapshot.snapshot_id if snapshot else None

    def get(self, name: str) -> DataFrame:
        source = self.pipeline.sources[name]
        if not isinstance(source, IcebergSource | DeltaSource):
            raise ConfigError(f"enrich source {name!r} is not a table")
        if not isinstance(source, IcebergSource):
            return read_table(self.spark, self.stack, source).df
        cached = self._cached.get(name)
        if cached is not None and cached[0] == self._current(source):
            return cached[1]
        if cached is not None:
            cached[1].unpersist()
        read = read_table(self.spark, self.stack, source)
        frame = read.df.persist()
        if read.snapshot_id is not None:
            self._cached[name] = (read.snapshot_id, frame)
        return frame

    def release(self) -> None:
        for _, frame in self._cached.values():
            frame.unpersist()
        self._cached.clear()


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
    started = time.monotonic()
    spec = stage.features
    events_source = _kafka(pipeline, stage.events)
    label = stage.label
    label_source = _kafka(pipeline, label.source) if label else None
    state = (
        FeatureState.load(states_location(stack, pipeline.namespace), spec, options.feature_state)
        if spec.needs_fit
        else FeatureState(spec.name, spec.fingerprint)
    )
    report = StageReport(
        pipeline.name, stage.name, "live", stage.channel, feature_state=state.version
    )
    checkpoint = stack.checkpoints / pipeline.namespace / pipeline.name / stage.name
    writer = _writer_id(checkpoint, pipeline, stage)
    report.lineage["writer"] = writer
    sink = training_sink(
        spark,
        stack,
        pipeline,
        stage,
        state,
        writer=writer,
        event_time=events_source.event_time,
        checkpoint=checkpoint / "main",
    )
    report.table = sink.where
    dead_table = dead_letter_table(stack, pipeline)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {stack.catalog.name}.{pipeline.namespace}")
    ensure_table(spark, dead_table, DEAD_LETTER_SCHEMA, "stage")

    sources: list[tuple[str, KafkaSource]] = [(stage.events, events_source)]
    if label and label_source:
        sources.append((label.source, label_source))

    def parsed(name: str, source: KafkaSource) -> DataFrame:
        raw = read_kafka(
            spark,
            stack.kafka,
            [source.topic],
            starting_offsets=source.starting_offsets,
            options=_reader_options(source),
        )
        return parse_kafka(raw, source, name)

    # -- intake: every record counted, the malformed ones kept as dead letters ----------------
    intake_frames = [parsed(n, s).select(*DEAD_LETTER_COLUMNS[:-1], REASON) for n, s in sources]
    intake = intake_frames[0]
    for frame in intake_frames[1:]:
        intake = intake.unionByName(frame)

    intake_ledger = BatchLedger(spark, dead_table, f"{writer}/intake")

    def write_intake(batch: DataFrame, batch_id: int) -> None:
        if batch_id <= intake_ledger.last:
            return  # a replay of a batch already committed
        batch = batch.persist()
        counts: dict[str, int] = {}
        for row in (
            batch.groupBy("source")
            .agg(
                F.count(F.lit(1)).alias("n"),
                F.sum((F.col(REASON) != "").cast("int")).alias("bad"),
            )
            .collect()
        ):
            counts[f"flow.input.{row['source']}"] = int(row["n"])
            counts[f"flow.dead.{row['source']}"] = int(row["bad"] or 0)
        dead = batch.where(F.col(REASON) != "").withColumnRenamed(REASON, "reason")
        intake_ledger.append(dead_letter_rows(dead, pipeline.name, stage.name), batch_id, counts)
        batch.unpersist()

    # -- main: valid records, labelled, enriched, featurized -------------------------------------
    def valid(name: str, source: KafkaSource) -> DataFrame:
        return (
            parsed(name, source).where(F.col(REASON) == "").select(*[f.name for f in source.fields])
        )

    rows = valid(stage.events, events_source)
    if label and label_source:
        rows = label_stream(
            rows,
            valid(label.source, label_source),
            label,
            events_source.event_time,
            events_source.watermark,
            label_source.event_time,
            label_source.watermark,
        )

    featurizer = Featurizer(spark, spec, state)
    dimensions = _Dimensions(spark, stack, pipeline)

    unusable_ledger = BatchLedger(spark, dead_table, f"{writer}/unusable")

    def write_main(batch: DataFrame, batch_id: int) -> None:
        if batch_id <= min(sink.last, unusable_ledger.last):
            return  # a replay of a batch already committed in full
        # Every action on `batch` would run the stateful join again: compute it once.
        joined = batch.persist()
        enriched = joined
        for spec_enrich in stage.enrich:
            # Dimensions are checked every micro-batch: updates show up while the stream runs.
            enriched = enrich(enriched, dimensions.get(spec_enrich.source), spec_enrich)
        enriched = enriched.persist()
        usable, unusable = split_unusable(enriched, spec, stage.events)
        training = featurizer.apply(usable).persist()
        positives = training.agg(F.sum("label")).first()
        sink.append(training, batch_id, int(positives[0] or 0) if positives else 0)
        unusable_ledger.append(dead_letter_rows(unusable, pipeline.name, stage.name), batch_id)
        for frame in (training, enriched, joined):
            frame.unpersist()

    def start(
        frame: DataFrame, role: str, sink: Callable[[DataFrame, int], None]
    ) -> StreamingQuery:
        writer_stream = (
            frame.writeStream.queryName(f"{pipeline.name}.{stage.name}.{role}")
            .foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint / role))
        )
        if options.mode == "continuous":
            writer_stream = writer_stream.trigger(processingTime=stage.trigger)
        else:
            writer_stream = writer_stream.trigger(availableNow=True)
        return writer_stream.start()

    queries = {"intake": start(intake, "intake", write_intake)}
    queries["main"] = start(rows, "main", write_main)
    progress(f"{stage.name}: streaming {', '.join(s.topic for _, s in sources)} ({options.mode})")
    watch = _Watch()
    try:
        _await(queries, options, watch, on_batch, progress, stop)
    finally:
        dimensions.release()

    intake_totals = writer_totals(spark, dead_table, f"{writer}/intake")
    report.training_rows, report.positives = sink.totals()
    unusable_totals = writer_totals(spark, dead_table, f"{writer}/unusable")
    report.events_input = intake_totals[f"flow.input.{stage.events}"]
    report.events_dead = (
        intake_totals[f"flow.dead.{stage.events}"] + unusable_totals["added-records"]
    )
    if label:
        report.labels_input = intake_totals[f"flow.input.{label.source}"]
        report.labels_dead = intake_totals[f"flow.dead.{label.source}"]
    report.pending = report.events_input - report.events_dead - report.training_rows
    if not label:
        report.pending_bound = 0  # nothing waits for a window without a label join
    elif watch.state_rows is not None:
        report.pending_bound = watch.state_rows + watch.late_dropped
    report.batches = watch.batches
    report.seconds = time.monotonic() - started
    report.extra = {
        "run_rows_in": float(watch.rows_in),
        "late_dropped": float(watch.late_dropped),
        "state_rows": float(watch.state_rows or 0),
    }
    progress(
        f"{stage.name}: {report.training_rows:,} training rows, {report.events_dead:,} dead "
        f"letters, {report.pending:,} pending in the label window (since the checkpoint began)"
    )
    return report
