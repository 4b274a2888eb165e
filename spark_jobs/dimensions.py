"""Dimension tables a live stage enriches with, re-read whenever they change."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.pipeline.model import Enrich, Pipeline
from flow.pipeline.sources import DeltaSource, IcebergSource
from flow.stack.iceberg import open_catalog
from spark_jobs.joins import dimension_side
from spark_jobs.sources import read_table

__all__ = ["Dimensions"]


class Dimensions:
    """Dimension tables for enrichment, re-read whenever they change.

    Each micro-batch asks an Iceberg table's catalog for its current snapshot (one small read
    through pyiceberg, not a Spark job); an enrichment's side of the join (the table with one
    row per key, its columns renamed) is built and cached again only when it changed, so an
    update is seen at the next batch and an unchanged table costs no scan and no shuffle.
    Delta tables are read every batch.
    """

    def __init__(self, spark: SparkSession, stack: StackConfig, pipeline: Pipeline) -> None:
        self.spark, self.stack, self.pipeline = spark, stack, pipeline
        self._catalog = open_catalog(stack.catalog)
        self._cached: dict[Enrich, tuple[int | None, DataFrame]] = {}

    def _current(self, source: IcebergSource) -> int | None:
        snapshot = self._catalog.load_table(source.table).current_snapshot()
        return snapshot.snapshot_id if snapshot else None

    def side(self, spec: Enrich) -> DataFrame:
        """``spec``'s dimension as the enrichment joins it (spark_jobs.joins.dimension_side)."""
        source = self.pipeline.sources[spec.source]
        if not isinstance(source, IcebergSource | DeltaSource):
            raise ConfigError(f"enrich source {spec.source!r} is not a table")
        if not isinstance(source, IcebergSource):
            return dimension_side(read_table(self.spark, self.stack, source).df, spec)
        cached = self._cached.get(spec)
        if cached is not None and cached[0] == self._current(source):
            return cached[1]
        if cached is not None:
            cached[1].unpersist()
        read = read_table(self.spark, self.stack, source)
        frame = dimension_side(read.df, spec).persist()
        self._cached[spec] = (read.snapshot_id, frame)  # None: a table without a snapshot yet
        return frame

    def changed(self) -> list[str]:
        """The Iceberg tables whose snapshot is no longer the one cached (one catalog read
        each): a query whose plan holds the cached sides reads them again by starting again."""
        found = []
        for spec, (snapshot, _) in self._cached.items():
            source = self.pipeline.sources[spec.source]
            if isinstance(source, IcebergSource) and self._current(source) != snapshot:
                found.append(source.table)
        return sorted(set(found))

    def release(self) -> None:
        for _, frame in self._cached.values():
            frame.unpersist()
        self._cached.clear()
