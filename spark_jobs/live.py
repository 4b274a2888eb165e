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
from functools import reduce
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from flow.config import StackConfig
from flow.errors import ConfigError, FlowError
from flow.pipeline.model import LiveStage, Pipeline
from flow.pipeline.run import RunOptions
from flow.pipeline.sources import KafkaSource
from flow.pipeline.state import FeatureState
from flow.storage import namespace_locations
from spark_jobs.dimensions import Dimensions
from spark_jobs.features import Featurizer
from spark_jobs.joins import label_stream
from spark_jobs.live_writers import BatchWriter, IntakeWriter, MainWriter
from spark_jobs.outputs import TrainingSink, training_sink
from spark_jobs.report import StageReport
from spark_jobs.sinks import BatchLedger, writer_totals
from spark_jobs.sources import read_kafka
from spark_jobs.stage import Progress, StageRun
from spark_jobs.validate import DEAD_LETTER_COLUMNS, REASON, parse_kafka

__all__ = ["StreamFailedError", "run_live"]

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


@dataclass(frozen=True)
class _Outputs:
    """Where a live run writes, and under which writer ids its commits are found again."""

    checkpoint: Path
    writer: str
    training: TrainingSink
    dead_letters: str

    @property
    def intake_writer(self) -> str:
        return f"{self.writer}/intake"

    @property
    def unusable_writer(self) -> str:
        return f"{self.writer}/unusable"


class LiveRun(StageRun[LiveStage]):
    """One run of a live stage, its phases in the order ``run`` lists them.

    What each query does per micro-batch is in :mod:`spark_jobs.live_writers`; waiting on the
    queries and reading their progress is ``_await`` and ``_poll`` above.
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
    ) -> None:
        super().__init__(spark, stack, pipeline, stage, "live", progress)
        self.options, self.on_batch, self.stop = options, on_batch, stop
        self.events = _kafka(pipeline, stage.events)
        self.labels = (stage.label, _kafka(pipeline, stage.label.source)) if stage.label else None

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
        writers = self.writers(outputs, state, dimensions)
        queries = self.start_queries(outputs.checkpoint, writers)
        topics = ", ".join(s.topic for _, s in self.sources)
        self.progress(f"{self.stage.name}: streaming {topics} ({self.options.mode})")
        watch = _Watch()
        try:
            _await(queries, self.options, watch, self.on_batch, self.progress, self.stop)
        finally:
            dimensions.release()
        return self.count(outputs, watch)

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
        # Local folders for now: the writer-id marker is a file the driver writes beside them.
        where = namespace_locations(self.stack, pipeline.namespace).checkpoints
        checkpoint = Path(where.child(pipeline.name, stage.name).path)
        writer = _writer_id(checkpoint, pipeline, stage)
        self.report.lineage["writer"] = writer
        training = training_sink(
            self.spark,
            self.stack,
            pipeline,
            stage,
            state,
            writer=writer,
            event_time=self.events.event_time,
            checkpoint=checkpoint / "main",
        )
        self.report.table = training.where
        self.ensure_namespace()
        return _Outputs(checkpoint, writer, training, self.open_dead_letters())

    def writers(
        self, outputs: _Outputs, state: FeatureState, dimensions: Dimensions
    ) -> dict[str, BatchWriter]:
        """Each query's per-batch writer, by query role."""
        ledger = BatchLedger(self.spark, outputs.dead_letters, outputs.intake_writer)
        unusable = BatchLedger(self.spark, outputs.dead_letters, outputs.unusable_writer)
        featurizer = Featurizer(self.spark, self.stage.features, state)
        name = self.pipeline.name
        return {
            "intake": IntakeWriter(ledger, name, self.stage.name),
            "main": MainWriter(
                self.stage, name, outputs.training, unusable, featurizer, dimensions
            ),
        }

    def _parsed(self, name: str, source: KafkaSource) -> DataFrame:
        raw = read_kafka(
            self.spark,
            self.stack.kafka,
            [source.topic],
            starting_offsets=source.starting_offsets,
            options=_reader_options(source),
        )
        return parse_kafka(raw, source, name)

    def intake_frame(self) -> DataFrame:
        """Every record of every topic, in the dead-letter layout, with its reason ('' if valid)."""
        frames = [
            self._parsed(n, s).select(*DEAD_LETTER_COLUMNS[:-1], REASON) for n, s in self.sources
        ]
        return reduce(DataFrame.unionByName, frames)

    def _valid(self, name: str, source: KafkaSource) -> DataFrame:
        valid = self._parsed(name, source).where(F.col(REASON) == "")
        return valid.select(*[f.name for f in source.fields])

    def labelled_frame(self) -> DataFrame:
        """The valid events, joined in the stream with their labels (watermarked) if any."""
        rows = self._valid(self.stage.events, self.events)
        if self.labels is None:
            return rows
        label, source = self.labels
        return label_stream(
            rows,
            self._valid(label.source, source),
            label,
            self.events.event_time,
            self.events.watermark,
            source.event_time,
            source.watermark,
        )

    def start_queries(
        self, checkpoint: Path, writers: dict[str, BatchWriter]
    ) -> dict[str, StreamingQuery]:
        """The intake query, then the main one, each under its own checkpoint."""
        frames = {"intake": self.intake_frame(), "main": self.labelled_frame()}
        return {role: self.start(role, frames[role], writers[role], checkpoint) for role in frames}

    def start(
        self, role: str, frame: DataFrame, writer: BatchWriter, checkpoint: Path
    ) -> StreamingQuery:
        stream = (
            frame.writeStream.queryName(f"{self.pipeline.name}.{self.stage.name}.{role}")
            .foreachBatch(writer)
            .option("checkpointLocation", str(checkpoint / role))
        )
        if self.options.mode == "continuous":
            stream = stream.trigger(processingTime=self.stage.trigger)
        else:
            stream = stream.trigger(availableNow=True)
        return stream.start()

    def count(self, outputs: _Outputs, watch: _Watch) -> StageReport:
        """The report: counts read back from the tables' commits (they hold across restarts),
        and what the queries' progress said during this run."""
        report, stage = self.report, self.stage
        intake = writer_totals(self.spark, outputs.dead_letters, outputs.intake_writer)
        report.training_rows, report.positives = outputs.training.totals()
        unusable = writer_totals(self.spark, outputs.dead_letters, outputs.unusable_writer)
        report.events_input = intake[f"flow.input.{stage.events}"]
        report.events_dead = intake[f"flow.dead.{stage.events}"] + unusable["added-records"]
        if stage.label:
            report.labels_input = intake[f"flow.input.{stage.label.source}"]
            report.labels_dead = intake[f"flow.dead.{stage.label.source}"]
        report.pending = report.events_input - report.events_dead - report.training_rows
        if not stage.label:
            report.pending_bound = 0  # nothing waits for a window without a label join
        elif watch.state_rows is not None:
            report.pending_bound = watch.state_rows + watch.late_dropped
        report.batches = watch.batches
        report.extra = {
            "run_rows_in": float(watch.rows_in),
            "late_dropped": float(watch.late_dropped),
            "state_rows": float(watch.state_rows or 0),
        }
        return self.finish(
            f"{stage.name}: {report.training_rows:,} training rows, {report.events_dead:,} dead "
            f"letters, {report.pending:,} pending in the label window (since the checkpoint began)"
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
