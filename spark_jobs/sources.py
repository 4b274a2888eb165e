"""Reading the stack's sources from Spark."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from flow.config import KafkaConfig, StackConfig
from flow.errors import ConfigError
from flow.pipeline.schema import Field
from flow.pipeline.sources import IcebergSource, TableSource
from spark_jobs.validate import SPARK_TYPES

__all__ = ["TableRead", "read_kafka", "read_table"]


def read_kafka(
    spark: SparkSession,
    kafka: KafkaConfig,
    topics: Sequence[str],
    *,
    starting_offsets: str = "earliest",
    options: dict[str, str] | None = None,
) -> DataFrame:
    """A streaming DataFrame of ``topics``: Kafka's key, value, topic, partition, offset, timestamp.

    ``starting_offsets`` applies only when the query has no checkpoint yet; afterwards the
    checkpoint decides, so a restarted query neither loses nor repeats records.
    """
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", ",".join(topics))
        .option("startingOffsets", starting_offsets)
    )
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    return reader.load()


@dataclass(frozen=True)
class TableRead:
    """A table source read, with what it read (for lineage and incremental reads)."""

    df: DataFrame
    table: str
    snapshot_id: int | None = None
    """Iceberg: the snapshot read (the newest one, for an incremental read)."""
    since_snapshot: int | None = None
    version: int | None = None
    """Delta: the table version read."""


def _check_columns(df: DataFrame, fields: tuple[Field, ...], table: str) -> None:
    actual = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    missing = [f.name for f in fields if f.name not in actual]
    if missing:
        raise ConfigError(
            f"table {table} has no column(s) {', '.join(missing)}; its columns: "
            f"{', '.join(sorted(actual))}"
        )
    declarable = {spark: field_type for field_type, spark in SPARK_TYPES.items()}
    for f in fields:
        found = actual[f.name]
        if found == SPARK_TYPES[f.type]:
            continue
        if found == "timestamp_ntz" and f.type == "timestamp":
            raise ConfigError(
                f"table {table}: column {f.name!r} is a timestamp without a time zone (Spark's "
                "timestamp_ntz); Field type 'timestamp' reads UTC timestamps (Iceberg "
                "timestamptz): write the column as UTC timestamps, e.g. `flow load FILE --table "
                f"{table} --replace` (docs/own-data.md)"
            )
        known = declarable.get(found)
        fix = (
            f"declare Field({f.name!r}, {known!r})"
            if known
            else f"no Field type reads {found}: convert the column"
        )
        raise ConfigError(f"table {table}: column {f.name!r} is {found}, declared {f.type}; {fix}")


def _event_range(df: DataFrame, source: TableSource) -> DataFrame:
    if source.event_time is None:
        return df
    column = F.col(source.event_time)
    if source.start is not None:
        df = df.where(column >= F.lit(source.start))
    if source.end is not None:
        df = df.where(column < F.lit(source.end))
    return df


CURRENT_SNAPSHOT = "current-snapshot-id"
"""The table property Iceberg's Spark catalog reports the current snapshot under."""


def _snapshot_at(spark: SparkSession, name: str, when: datetime | None) -> int | None:
    """The snapshot that was current at ``when`` (now, if None).

    Now: the table's ``current-snapshot-id`` property, which SHOW TBLPROPERTIES answers on the
    driver without a Spark job (0.07 s against 0.24 s for the history query locally; on a
    cluster a job is a round of tasks on the executors: ~0.3 s more for each of a backfill's
    jobs, docs/experiments/2026-11-28-cluster-timings.md). At a time: the history table."""
    if when is None:
        (prop,) = spark.sql(f"SHOW TBLPROPERTIES {name} ('{CURRENT_SNAPSHOT}')").collect()
        value = str(prop["value"])  # a missing property (no snapshot yet) is a sentence
        return int(value) if value.lstrip("-").isdigit() else None
    history = spark.table(f"{name}.history").where(F.col("is_current_ancestor"))
    history = history.where(F.col("made_current_at") <= F.lit(when))
    row = history.orderBy(F.desc("made_current_at")).select("snapshot_id").first()
    return int(row[0]) if row else None


def read_table(spark: SparkSession, stack: StackConfig, source: TableSource) -> TableRead:
    """The declared columns of a table source, as of the snapshot or version it asks for."""
    if isinstance(source, IcebergSource):
        name = f"{stack.catalog.name}.{source.table}"
        if not spark.catalog.tableExists(name):
            raise ConfigError(
                f"Iceberg table {source.table} does not exist in catalog {stack.catalog.name}; "
                "create it (e.g. `flow generate history`) or fix IcebergSource.table"
            )
        spark.catalog.refreshTable(name)
        reader = spark.read.format("iceberg")
        snapshot = source.snapshot_id
        # Iceberg 1.11 on Spark 4 takes time travel through Spark's own options.
        if source.snapshot_id is not None:
            reader = reader.option("versionAsOf", str(source.snapshot_id))
        elif source.as_of is not None:
            reader = reader.option("timestampAsOf", source.as_of.isoformat())
        elif source.since_snapshot is not None:
            reader = reader.option("start-snapshot-id", str(source.since_snapshot))
        df = reader.load(name)
        if snapshot is None:
            snapshot = _snapshot_at(spark, name, source.as_of)
        _check_columns(df, source.columns, source.table)
        df = _event_range(df.select(*[f.name for f in source.columns]), source)
        return TableRead(df, source.table, snapshot, source.since_snapshot)

    path = (
        source.path
        if "://" in source.path or source.path.startswith("/")
        else str(stack.lake / source.path)
    )
    reader = spark.read.format("delta")
    if source.version is not None:
        reader = reader.option("versionAsOf", str(source.version))
    elif source.timestamp is not None:
        reader = reader.option("timestampAsOf", source.timestamp.isoformat())
    df = reader.load(path)
    _check_columns(df, source.columns, path)
    version = source.version
    if version is None:
        latest = DeltaTable.forPath(spark, path).history(1).select("version").first()
        version = int(latest[0]) if latest else None
    df = _event_range(df.select(*[f.name for f in source.columns]), source)
    return TableRead(df, path, version=version)
