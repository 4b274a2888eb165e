"""One run of a live stage, its phases in the order :meth:`LiveRun.run` lists them.

Check that every output can be written; load the fitted feature state; open the outputs (the
checkpoint and its writer id, the training sink, the dead-letter table); choose the writer (its
writes inside the streaming plan where the stage allows it, spark_jobs.live.inplan, else
spark_jobs.live.stream_writer: :func:`choose_writer`, said in one line and tagged on the stage's
run); run the query under supervision (spark_jobs.live.plan builds
it, spark_jobs.live.supervise waits on it and restarts it); report what the tables' commits
say, reconciled (:meth:`LiveRun.count`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from flow.config import StackConfig
from flow.pipeline.model import LiveStage, Pipeline
from flow.pipeline.run import RunOptions
from flow.pipeline.sources import KafkaSource
from flow.pipeline.state import FeatureState
from flow.storage import Location, namespace_locations
from spark_jobs.dimensions import Dimensions
from spark_jobs.features import Featurizer
from spark_jobs.joins import enrichment_names
from spark_jobs.jvm import JavaError
from spark_jobs.live.batch_facts import events_in_join
from spark_jobs.live.inplan import InPlanWriter, unsupported
from spark_jobs.live.lag import LatestOffsets
from spark_jobs.live.parts import WriterParts
from spark_jobs.live.plan import LiveQuery, spark_counts_state
from spark_jobs.live.stream_writer import StreamWriter
from spark_jobs.live.supervise import OnBatch, Supervisor, Watch
from spark_jobs.outputs import HandoffSink, TrainingSink, training_sink
from spark_jobs.report import StageReport
from spark_jobs.sinks import LEDGER_RETENTION, BatchLedger, writer_totals
from spark_jobs.stage import Progress, StageRun

__all__ = [
    "IN_PLAN",
    "QUERY",
    "VOCABULARIES",
    "WRITER_REASON_TAG",
    "WRITER_TAG",
    "LiveRun",
    "choose_writer",
    "run_live",
]

WRITER_TAG, WRITER_REASON_TAG = "flow.live.writer", "flow.live.writer_reason"
"""The stage run's MLflow tags: which writer ran its batches (``inplan`` or ``stream``), and why."""
IN_PLAN = "its writes run inside the streaming plan, one Spark job a batch"
"""Why the in-plan writer was chosen: the reason it is the default."""


def choose_writer(
    pipeline: Pipeline, stage: LiveStage, events: KafkaSource
) -> tuple[Literal["inplan", "stream"], str]:
    """Which writer runs the stage's batches, and why: the in-plan writer
    (spark_jobs.live.inplan) wherever it can, else the stream writer, with what keeps the
    stage from the plan (:func:`spark_jobs.live.inplan.unsupported`)."""
    why = unsupported(pipeline, stage, events)
    return ("inplan", IN_PLAN) if why is None else ("stream", why)


def _writer_id(
    checkpoint: Location, pipeline: Pipeline, stage: LiveStage, marker: str = "writer-id"
) -> str:
    """Names this stage's checkpoint incarnation: a deleted checkpoint starts a new writer, whose
    batch ids (from 0 again) are not mistaken for ones already committed."""
    if not checkpoint.exists(marker):
        checkpoint.write_bytes(marker, uuid.uuid4().hex[:12].encode())
    return f"{pipeline.name}.{stage.name}:{checkpoint.read_bytes(marker).decode().strip()}"


VOCABULARIES = "flow-vocabularies"
"""The fitted vocabularies as Parquet files, in the query's checkpoint, one folder a state
version (spark_jobs.features.Featurizer)."""

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

    Its query is :attr:`query` (spark_jobs.live.plan); what the query does per micro-batch is
    its writer's (spark_jobs.live.inplan, spark_jobs.live.stream_writer); waiting on the query,
    reading its progress and restarting it are spark_jobs.live.supervise's.
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
        self.query = LiveQuery(spark, stack, pipeline, stage, options)

    def run(self) -> StageReport:
        self.check_outputs()
        state = self.feature_state()
        outputs = self.open_outputs(state)
        dimensions = Dimensions(self.spark, self.stack, self.pipeline)
        writer = self.writer(outputs, state, dimensions)
        topics = ", ".join(s.topic for _, s in self.query.sources)
        self.progress(f"{self.stage.name}: streaming {topics} ({self.options.mode})")
        watch = Watch(
            records_read=writer.records_read,
            steps=writer.steps,
            counts_state=spark_counts_state(self.stage.state_store),
        )
        supervisor = Supervisor(
            self.stage.name,
            self.options,
            self.on_batch,
            self.progress,
            self.stop,
            self.sleep,
            latest=LatestOffsets(self.stack.kafka),
        )
        try:
            supervisor.run(partial(self.query.start, outputs.checkpoint, writer, watch), watch)
        finally:
            if isinstance(writer, InPlanWriter):
                writer.release()
            writer.ledger.wait()  # an expiry of old ledger snapshots in flight
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
            event_time=self.query.events.event_time,
            checkpoint=checkpoint,
        )
        self.report.table = training.where
        self.ensure_namespace()
        return _Outputs(checkpoint, writer, training, self.open_dead_letters())

    def writer(
        self, outputs: _Outputs, state: FeatureState, dimensions: Dimensions
    ) -> StreamWriter | InPlanWriter:
        """The query's per-batch writer: the writes inside the streaming plan where the stage
        allows it (spark_jobs.live.inplan), else a writer of its own per batch; the choice is
        one line and two tags on the stage's run (``flow.live.writer``, ``..._reason``)."""
        parts = WriterParts(
            self.spark,
            self.stage,
            self.pipeline.name,
            self.query.sources,
            query_name=self.query.name,
            checkpoint=outputs.checkpoint,
            ledger=BatchLedger(
                self.spark, outputs.dead_letters, outputs.writer, LEDGER_RETENTION, self.progress
            ),
            # The vocabularies as files in the checkpoint (shared storage on a cluster), which
            # each batch's broadcast scans: from the driver, every batch's tasks carried them.
            featurizer=Featurizer(
                self.spark, self.stage.features, state, outputs.checkpoint.child(VOCABULARIES)
            ),
            dimensions=dimensions,
            progress=self.progress,
        )
        training = outputs.training
        kind, why = choose_writer(self.pipeline, self.stage, self.query.events)
        self.report.tags[WRITER_TAG], self.report.tags[WRITER_REASON_TAG] = kind, why
        self.progress(f"{self.stage.name}: writer {kind} ({why})")
        if kind == "inplan":
            assert isinstance(training, HandoffSink)  # choose_writer said: a handoff output
            return InPlanWriter(parts, training)
        return StreamWriter(parts, training)

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

    def count(self, outputs: _Outputs, watch: Watch, ledger_last: int) -> StageReport:
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
            report.labels_unmatched = outcome("unmatched", labels)
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
        dead = report.dead_letters
        unmatched = (
            f", {report.labels_unmatched:,} {stage.label.source} labelled nothing"
            if stage.label
            else ""
        )
        return self.finish(
            f"{stage.name}: {report.training_rows:,} training rows, {dead:,} dead "
            f"letters ({late:,} late), {report.duplicates:,} duplicates, {waiting}{unmatched} "
            f"(since the checkpoint began){report.said_missing()}"
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
