"""Dimension tables a live stage enriches with, re-read whenever they change."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.pipeline.model import Pipeline
from flow.pipeline.sources import DeltaSource, IcebergSource
from flow.stack.iceberg import open_catalog
from spark_jobs.sources import read_table

__all__ = ["Dimensions"]


class Dimensions:
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
