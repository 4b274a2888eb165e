"""What a live stage's streaming queries do with each micro-batch (their ``foreachBatch``).

Structured Streaming may run a batch id again after a failure; each writer commits a batch id
once, through a ledger or sink that knows the last id it committed, so a replay writes nothing.
A writer is a plain callable over (batch, batch id) holding no query, so queries can be
restarted, or merged into one that calls both writers, without changing what a batch writes.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from flow.pipeline.model import LiveStage
from spark_jobs.dimensions import Dimensions
from spark_jobs.features import Featurizer
from spark_jobs.outputs import TrainingSink
from spark_jobs.rows import split_unusable
from spark_jobs.sinks import BatchLedger, dead_letter_rows
from spark_jobs.stage import enriched, input_counts, positives
from spark_jobs.validate import REASON

__all__ = ["BatchWriter", "IntakeWriter", "MainWriter", "source_counts"]

BatchWriter = Callable[[DataFrame, int], None]


def source_counts(batch: DataFrame) -> dict[str, int]:
    """Records read and records invalid, per source: the counts a live report reconciles."""
    counts: dict[str, int] = {}
    for row in batch.groupBy("source").agg(*input_counts()).collect():
        counts[f"flow.input.{row['source']}"] = int(row["n"])
        counts[f"flow.dead.{row['source']}"] = int(row["bad"] or 0)
    return counts


class IntakeWriter:
    """The intake query's batches: every record counted, the malformed ones kept as dead letters,
    counts and dead letters in one commit to the dead-letter table."""

    def __init__(self, ledger: BatchLedger, pipeline: str, stage: str) -> None:
        self.ledger, self.pipeline, self.stage = ledger, pipeline, stage

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        if batch_id <= self.ledger.last:
            return  # a replay of a batch already committed
        batch = batch.persist()
        counts = source_counts(batch)
        dead = batch.where(F.col(REASON) != "").withColumnRenamed(REASON, "reason")
        self.ledger.append(dead_letter_rows(dead, self.pipeline, self.stage), batch_id, counts)
        batch.unpersist()


class MainWriter:
    """The main query's batches: labelled rows enriched with the dimension tables as they are
    now, featurized and appended; rows that cannot train (no label, no weight) are dead letters."""

    def __init__(
        self,
        stage: LiveStage,
        pipeline: str,
        training: TrainingSink,
        unusable: BatchLedger,
        featurizer: Featurizer,
        dimensions: Dimensions,
    ) -> None:
        self.stage, self.pipeline = stage, pipeline
        self.training, self.unusable = training, unusable
        self.featurizer, self.dimensions = featurizer, dimensions

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        if batch_id <= min(self.training.last, self.unusable.last):
            return  # a replay of a batch already committed in full
        # Every action on `batch` would run the stateful join again: compute it once.
        joined = batch.persist()
        # Dimensions are checked every micro-batch: updates show up while the stream runs.
        rows = enriched(joined, self.stage.enrich, self.dimensions.get).persist()
        usable, unusable = split_unusable(rows, self.stage.features, self.stage.events)
        training = self.featurizer.apply(usable).persist()
        self.training.append(training, batch_id, positives(training))
        dead = dead_letter_rows(unusable, self.pipeline, self.stage.name)
        self.unusable.append(dead, batch_id)
        for frame in (training, rows, joined):
            frame.unpersist()
