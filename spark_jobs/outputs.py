"""Where a live stage's training rows go, batch after batch: a handoff channel or a table.

Both kinds commit each micro-batch once under the stage's writer id, know the last batch they
committed (a replay at or below it writes nothing) and total what they hold from their own
commits, so a stage's counts survive restarts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

from pyspark.sql import DataFrame, SparkSession

from flow.config import StackConfig
from flow.handoff import Channel
from flow.pipeline.model import HandoffOutput, LiveStage, Pipeline
from flow.pipeline.state import FeatureState
from flow.storage import Location
from spark_jobs.handoff import ExportOptions, prepare_export
from spark_jobs.rows import channel_for, export_options, serving_features, training_table
from spark_jobs.sinks import BatchLedger, writer_totals
from spark_jobs.stage import positives

__all__ = ["HandoffSink", "TrainingSink", "training_sink"]


class TrainingSink(Protocol):
    where: str
    """The table or channel, for reports."""
    last: int
    """The last batch id this writer committed (-1: none)."""

    def append(self, rows: DataFrame, batch_id: int) -> None:
        """Commit ``rows`` (training rows) as ``batch_id``, with how many are positives."""
        ...

    def prepare(self, rows: DataFrame, batch_id: int) -> Callable[[], None]:
        """:meth:`append` in two steps: the checks and the planning now (no Spark job), the
        write and commit when the returned function is called."""
        ...

    def totals(self, upto: int | None = None) -> tuple[int, int]:
        """(rows, positives) over every batch this writer committed (up to batch ``upto``)."""
        ...


def _offsets(checkpoint: Location, batch_id: int) -> list[Any]:
    """The Kafka offsets a micro-batch read, from the query's write-ahead offset log."""
    try:
        lines = checkpoint.child("offsets").read_bytes(str(batch_id)).decode().splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    # Line 1: version; line 2: batch metadata; then one line of offsets per source.
    return [json.loads(line) for line in lines[2:] if line.startswith("{")]


class HandoffSink:
    """A live stage's handoff channel, committed once per batch id under its writer id."""

    def __init__(
        self,
        channel: Channel,
        writer: str,
        pipeline: Pipeline,
        stage: LiveStage,
        state: FeatureState,
        event_time: str | None,
        checkpoint: Location,
    ) -> None:
        self.channel = channel
        self.where = channel.folder.uri
        self.writer = writer
        self.pipeline, self.stage, self.state = pipeline, stage, state
        self.event_time = event_time
        self.checkpoint = checkpoint
        # Once, not per micro-batch: the state's vocabularies can be large. No example rows: a
        # live stage's raw rows exist only inside the streaming plan.
        self.features = serving_features(pipeline, stage, state)
        mine = [b for b in self._ids() if self.channel.commit(b).writer == writer]
        self.last = max(mine) if mine else -1

    def _ids(self) -> list[int]:
        return self.channel.commit_ids() if self.channel.exists() else []

    def append(self, rows: DataFrame, batch_id: int) -> None:
        self.prepare(rows, batch_id)()

    def options(self, seed: int) -> ExportOptions:
        """How a batch's rows become shards (the writer tasks count the positives)."""
        label = self.stage.label
        return export_options(
            self.pipeline,
            self.stage,
            self.state,
            self.event_time,
            seed=seed,
            labels=label.channel_labels(streaming=True) if label else None,
            count_positives=True,  # by the tasks that write the shards: no job of its own
            features=self.features,
        )

    def source_positions(self, batch_id: int) -> dict[str, Any]:
        """What a batch's commit records it read: its Kafka offsets, from the offset log."""
        return {"kafka": _offsets(self.checkpoint, batch_id)}

    def prepare(self, rows: DataFrame, batch_id: int) -> Callable[[], None]:
        if batch_id <= self.last:
            return lambda: None
        write = prepare_export(
            rows,
            self.channel,
            batch_id,
            options=self.options(seed=batch_id),
            writer=self.writer,
            source_positions=self.source_positions(batch_id),
        )

        def run() -> None:
            write()
            self.last = batch_id

        return run

    def totals(self, upto: int | None = None) -> tuple[int, int]:
        ids = [b for b in self._ids() if upto is None or b <= upto]
        mine = [c for c in (self.channel.commit(b) for b in ids) if c.writer == self.writer]
        return sum(c.rows for c in mine), int(sum(c.stats.get("positives", 0) for c in mine))


class _TableSink:
    def __init__(self, spark: SparkSession, table: str, writer: str) -> None:
        self.spark = spark
        self.where = table
        self.writer = writer
        # No retention (spark_jobs.sinks.LedgerRetention): a training table's snapshots are
        # what an incremental reader of it reads by (rows appended after a snapshot).
        self.ledger = BatchLedger(spark, table, writer)
        self.last = self.ledger.last

    def prepare(self, rows: DataFrame, batch_id: int) -> Callable[[], None]:
        return lambda: self.append(rows, batch_id)

    def append(self, rows: DataFrame, batch_id: int) -> None:
        if batch_id <= self.ledger.last:
            return
        if self.ledger.last < 0 and not self.spark.catalog.tableExists(self.where):
            rows.limit(0).writeTo(self.where).using("iceberg").create()
        # The count goes in the commit's summary, so it is known before the write: one job.
        rows = rows.persist()
        self.ledger.append(rows, batch_id, {"flow.positives": positives(rows)})
        rows.unpersist()
        self.last = self.ledger.last

    def totals(self, upto: int | None = None) -> tuple[int, int]:
        found = writer_totals(self.spark, self.where, self.writer, upto)
        return found["added-records"], found["flow.positives"]


def training_sink(
    spark: SparkSession,
    stack: StackConfig,
    pipeline: Pipeline,
    stage: LiveStage,
    state: FeatureState,
    *,
    writer: str,
    event_time: str | None,
    checkpoint: Location,
) -> TrainingSink:
    """The sink a live stage writes to, per the pipeline's output."""
    if isinstance(pipeline.output, HandoffOutput):
        channel = channel_for(stack, pipeline, stage.channel)
        return HandoffSink(channel, writer, pipeline, stage, state, event_time, checkpoint)
    return _TableSink(spark, training_table(stack, pipeline, stage.channel), f"{writer}/main")
