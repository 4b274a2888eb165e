"""What a live stage's streaming query does with each micro-batch (its ``foreachBatch``).

The query hands over two kinds of rows in one batch (``_kind``): every record the batch read
from Kafka, in the dead-letter layout with its reason ('' if valid) and its event time
(``record``), and the rows the label join emitted (``row``). The writer accounts for every
record in the batch's commit: counted per source, the invalid ones (malformed, out-of-range event
time) and the late ones (at or before the late-event watermark, which Spark's operators drop)
written as dead letters with their reason, the duplicates Spark dropped counted; and it
enriches, featurizes and appends the joined rows.

Structured Streaming may run a batch id again after a failure; the writer commits a batch id once
to each of its two sinks (the training rows, the dead-letter ledger), each of which knows the
last id it committed, so a replay writes nothing twice. Counts are computed from the batch
itself, from the offset log and from the batch's operator metrics: a replay computes the same.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from flow.pipeline.model import LiveStage
from flow.pipeline.sources import KafkaSource
from spark_jobs.batch_facts import Dropped, dropped_rows, late_threshold_ms
from spark_jobs.dimensions import Dimensions
from spark_jobs.features import Featurizer
from spark_jobs.joins import dedup_kind
from spark_jobs.outputs import TrainingSink
from spark_jobs.rows import split_unusable
from spark_jobs.sinks import BatchLedger, dead_letter_rows
from spark_jobs.stage import enriched, positives
from spark_jobs.validate import DEAD_LETTER_COLUMNS, REASON

__all__ = ["EVENT_TIME", "KIND", "RECORD", "BatchWriter", "StreamWriter", "record_column"]

BatchWriter = Callable[[DataFrame, int], None]
KIND = "_kind"
"""Which rows of a batch are records read (``record``) and which joined rows (``row``)."""
RECORD = "_record"
"""A record's dead-letter columns, reason and event time, as one struct (no name can clash
with the events' own columns in the union)."""
EVENT_TIME = "event_time"
"""The record's typed event time, inside :data:`RECORD`."""


def record_column(event_time: str) -> Column:
    """The :data:`RECORD` struct of a parsed source's rows (see spark_jobs.validate)."""
    return F.struct(
        *DEAD_LETTER_COLUMNS[:-1], F.col(REASON), F.col(event_time).alias(EVENT_TIME)
    ).alias(RECORD)


def _late_reason(threshold_ms: int, watermarks: dict[str, str]) -> Column:
    behind = (F.lit(threshold_ms) - F.unix_millis(F.col(EVENT_TIME))) / 1000.0
    delay = F.lit("")
    for source, watermark in watermarks.items():
        delay = F.when(F.col("source") == source, F.lit(watermark)).otherwise(delay)
    return F.concat(
        F.lit("late: event time "),
        F.date_format(F.col(EVENT_TIME), "yyyy-MM-dd HH:mm:ss"),
        F.lit(" is "),
        F.format_number(behind, 1),
        F.lit(" s behind the watermark "),
        F.date_format(F.timestamp_millis(F.lit(threshold_ms)), "yyyy-MM-dd HH:mm:ss"),
        F.lit(" (the source's watermark delay is "),
        delay,
        F.lit(")"),
    )


class StreamWriter:
    """One live stage's micro-batches: records accounted for, joined rows trained on."""

    def __init__(
        self,
        spark: SparkSession,
        stage: LiveStage,
        pipeline: str,
        sources: Sequence[tuple[str, KafkaSource]],
        *,
        query_name: str,
        checkpoint: Path,
        training: TrainingSink,
        ledger: BatchLedger,
        featurizer: Featurizer,
        dimensions: Dimensions,
    ) -> None:
        self.spark, self.stage, self.pipeline = spark, stage, pipeline
        self.sources = list(sources)
        self.query_name, self.checkpoint = query_name, checkpoint
        self.training, self.ledger = training, ledger
        self.featurizer, self.dimensions = featurizer, dimensions
        self.records_read: dict[int, int] = {}
        """Kafka records each batch read (all sources), by batch id."""

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        if batch_id <= min(self.training.last, self.ledger.last):
            return  # a replay of a batch already committed in full
        # Every action on `batch` would run the stateful operators again: compute it once.
        batch = batch.persist()
        batch.count()  # materialized: the operators' metrics for this batch are final now
        dropped = dropped_rows(self.spark, self.query_name, dedup_kind)
        records = self._records(batch, late_threshold_ms(self.checkpoint, batch_id))
        counts = self._counts(records, dropped)
        self.records_read[batch_id] = sum(
            n for k, n in counts.items() if k.startswith("flow.input.")
        )
        rows = batch.where(F.col(KIND) == "row").drop(KIND, RECORD)
        unusable = self._train(rows, batch_id)
        counts[f"flow.unusable.{self.stage.events}"] = unusable.count()
        dead = records.where(F.col(REASON) != "").withColumnRenamed(REASON, "reason")
        letters = dead_letter_rows(dead, self.pipeline, self.stage.name).unionByName(
            dead_letter_rows(unusable, self.pipeline, self.stage.name)
        )
        self.ledger.append(letters, batch_id, counts)
        for frame in (unusable, records, batch):
            frame.unpersist()

    def _records(self, batch: DataFrame, threshold_ms: int) -> DataFrame:
        """The batch's records, late ones given their reason; ``_invalid`` marks the others."""
        records = batch.where(F.col(KIND) == "record").select(f"{RECORD}.*")
        valid = F.col(REASON) == ""
        late = valid & F.col(EVENT_TIME).isNotNull()
        late = late & (F.unix_millis(F.col(EVENT_TIME)) <= F.lit(threshold_ms))
        watermarks = {name: source.watermark for name, source in self.sources}
        return (
            records.select(
                "*",
                (~valid).alias("_invalid"),
                late.alias("_late"),
            )
            .withColumn(
                REASON,
                F.when(F.col("_late"), _late_reason(threshold_ms, watermarks)).otherwise(
                    F.col(REASON)
                ),
            )
            .persist()
        )

    def _counts(self, records: DataFrame, dropped: Dropped) -> dict[str, int]:
        """Per source: records read, invalid, late; duplicates the operators dropped."""
        counts: dict[str, int] = {}
        totals = records.groupBy("source").agg(
            F.count(F.lit(1)).alias("n"),
            F.sum(F.col("_invalid").cast("int")).alias("invalid"),
            F.sum(F.col("_late").cast("int")).alias("late"),
        )
        for row in totals.collect():
            for kind in ("n", "invalid", "late"):
                name = "input" if kind == "n" else kind
                counts[f"flow.{name}.{row['source']}"] = int(row[kind] or 0)
        counts[f"flow.duplicates.{self.stage.events}"] = dropped.duplicate_events
        if self.stage.label is not None:
            counts[f"flow.duplicates.{self.stage.label.source}"] = dropped.duplicate_labels
        counts["flow.operators_late"] = dropped.late  # Spark's own count, to check ours against
        return counts

    def _train(self, rows: DataFrame, batch_id: int) -> DataFrame:
        """Enrich (dimensions as they are now), featurize and append the joined rows; the ones
        that cannot train (no label, no weight) come back as dead letters."""
        rows = enriched(rows, self.stage.enrich, self.dimensions.side).persist()
        usable, unusable = split_unusable(rows, self.stage.features, self.stage.events)
        training = self.featurizer.apply(usable).persist()
        self.training.append(training, batch_id, positives(training))
        unusable = unusable.persist()
        unusable.count()
        for frame in (training, rows):
            frame.unpersist()
        return unusable
