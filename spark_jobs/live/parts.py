"""What every live writer is made of, given once by the run (spark_jobs.live.run).

Both writers (spark_jobs.live.inplan, spark_jobs.live.stream_writer) took the same ten
arguments, each constructor its own copy of them; a part added to one was easily forgotten in
the other. The training sink is not here: its type is what tells the writers apart (the in-plan
writer writes a handoff channel only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyspark.sql import SparkSession

from flow.pipeline.model import LiveStage
from flow.pipeline.sources import KafkaSource
from flow.storage import Location
from spark_jobs.dimensions import Dimensions
from spark_jobs.features import Featurizer
from spark_jobs.sinks import BatchLedger

__all__ = ["WriterParts"]


@dataclass(frozen=True)
class WriterParts:
    """A live stage's writer's parts, but its training sink."""

    spark: SparkSession
    stage: LiveStage
    pipeline: str
    """The pipeline's name (the dead letters carry it)."""
    sources: Sequence[tuple[str, KafkaSource]]
    """The topics the stage reads, by source name: events, then labels."""
    query_name: str
    """The streaming query's name, by which its batches' plans are found (batch_facts)."""
    checkpoint: Location
    """The query's checkpoint: the offset log (late thresholds), the pending ledger."""
    ledger: BatchLedger
    """The dead-letter table's batches of this writer, each with its counts."""
    featurizer: Featurizer
    dimensions: Dimensions
    progress: Callable[[str], None] = lambda _: None
