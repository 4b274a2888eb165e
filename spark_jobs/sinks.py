"""Iceberg sinks that a replayed micro-batch cannot duplicate.

Structured Streaming may run a batch id again after a failure. Each write records who wrote it
and for which batch in the Iceberg snapshot's summary (``flow.writer``, ``flow.batch``); a write
whose pair is already committed is skipped. Counts travel in the same commit, so totals read
back from the table (``writer_totals``) hold across restarts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.constants import batch_time

__all__ = [
    "DEAD_LETTER_SCHEMA",
    "LEDGER_PROPERTIES",
    "BatchLedger",
    "append_once",
    "committed",
    "dead_letter_rows",
    "ensure_table",
    "writer_totals",
]

DEAD_LETTER_SCHEMA = StructType(
    [
        StructField("pipeline", StringType()),
        StructField("stage", StringType()),
        StructField("source", StringType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("kafka_timestamp", TimestampType()),
        StructField("key", BinaryType()),
        StructField("raw", BinaryType()),
        StructField("reason", StringType()),
        StructField("recorded_at", TimestampType()),
    ]
)


LEDGER_PROPERTIES = {
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "20",
}
"""Table properties of a table that takes a commit every micro-batch (the dead letters and
counts: 17,000 commits a day at a 5 s trigger). Iceberg keeps every ``metadata.json`` it wrote
unless told, and each lists every snapshot: kept, they grow as the square of the batches (1.7 MB
after 40 micro-batches, ~26 GB after 5,000: ``flow bench soak``). These keep the last 20."""


def ensure_table(
    spark: SparkSession,
    name: str,
    schema: StructType,
    partitioned_by: str = "",
    properties: Mapping[str, str] | None = None,
) -> None:
    """Create the Iceberg table ``name`` with ``schema`` and ``properties`` unless it exists;
    an existing table is given those of ``properties`` it has no value for (a table made
    before they were set), never a value changed."""
    if spark.catalog.tableExists(name):
        if properties:
            held = {r["key"] for r in spark.sql(f"SHOW TBLPROPERTIES {name}").collect()}
            missing = {k: v for k, v in properties.items() if k not in held}
            if missing:
                spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ({_properties(missing)})")
        return
    columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in schema.fields)
    partition = f" PARTITIONED BY ({partitioned_by})" if partitioned_by else ""
    held_as = f" TBLPROPERTIES ({_properties(properties)})" if properties else ""
    spark.sql(f"CREATE TABLE IF NOT EXISTS {name} ({columns}) USING iceberg{partition}{held_as}")


def _properties(properties: Mapping[str, str]) -> str:
    return ", ".join(f"'{k}'='{v}'" for k, v in properties.items())


def committed(spark: SparkSession, table: str, writer: str, batch: int) -> bool:
    """Whether ``writer`` already committed ``batch`` to ``table``."""
    found = _commits(spark, table, writer).where(F.col("summary")["flow.batch"] == str(batch))
    return found.limit(1).count() > 0


def _commits(spark: SparkSession, table: str, writer: str) -> DataFrame:
    """The snapshots of ``table`` that ``writer`` committed."""
    spark.catalog.refreshTable(table)
    snapshots = spark.table(f"{table}.snapshots")
    return snapshots.where(F.col("summary")["flow.writer"] == writer)


def append_once(
    df: DataFrame,
    table: str,
    writer: str,
    batch: int,
    properties: Mapping[str, int] | None = None,
) -> bool:
    """Append ``df`` as batch ``batch`` of ``writer``; False, writing nothing, if already done.

    ``properties`` (counts) are stored in the commit's snapshot summary next to the writer and
    batch. An empty ``df`` still commits, carrying its counts.
    """
    if committed(df.sparkSession, table, writer, batch):
        return False
    _append(df, table, writer, batch, properties)
    return True


class BatchLedger:
    """The batches one writer has committed to one table, read once, then kept in memory.

    Structured Streaming gives a query's batches increasing ids and, after a failure, replays
    only ids at or below the last one it started. So the highest id committed when a stage
    starts is all a writer needs to skip replays: no metadata scan per micro-batch.
    """

    def __init__(self, spark: SparkSession, table: str, writer: str) -> None:
        self.table = table
        self.writer = writer
        self.last = -1
        if spark.catalog.tableExists(table):
            batches = (
                _commits(spark, table, writer)
                .select(F.max(F.col("summary")["flow.batch"].cast("bigint")).alias("last"))
                .first()
            )
            if batches is not None and batches["last"] is not None:
                self.last = int(batches["last"])

    def append(
        self,
        df: DataFrame,
        batch: int,
        properties: Mapping[str, int] | None = None,
        *,
        few: bool = False,
    ) -> bool:
        """Append ``df`` as ``batch`` unless it was committed already; True if written.

        ``few``: ``df`` is small (a micro-batch's dead letters), so one task writes it as one
        file, without the shuffle that the table's write distribution would add, a Spark stage
        of its own every batch."""
        if batch <= self.last:
            return False
        _append(df, self.table, self.writer, batch, properties, few=few)
        self.last = batch
        return True


def _append(
    df: DataFrame,
    table: str,
    writer: str,
    batch: int,
    properties: Mapping[str, int] | None,
    *,
    few: bool = False,
) -> None:
    options = {"snapshot-property.flow.writer": writer, "snapshot-property.flow.batch": str(batch)}
    options |= {f"snapshot-property.{k}": str(int(v)) for k, v in (properties or {}).items()}
    if few:
        df = df.coalesce(1)
        options["distribution-mode"] = "none"
    df.writeTo(table).options(**options).append()


def writer_totals(
    spark: SparkSession, table: str, writer: str, upto: int | None = None
) -> Counter[str]:
    """Sums over every commit of ``writer`` (of batches up to ``upto``, if given):
    ``added-records`` and each ``flow.*`` count."""
    totals: Counter[str] = Counter()
    if not spark.catalog.tableExists(table):
        return totals
    for row in _commits(spark, table, writer).select("summary").collect():
        summary = row["summary"]
        if upto is not None and int(summary.get("flow.batch") or -1) > upto:
            continue
        totals["commits"] += 1
        totals["added-records"] += int(summary.get("added-records") or 0)
        for key, value in summary.items():
            if key.startswith("flow.") and key not in ("flow.writer", "flow.batch"):
                totals[key] += int(value)
    return totals


def dead_letter_rows(dead: DataFrame, pipeline: str, stage: str) -> DataFrame:
    """Dead letters from :func:`spark_jobs.validate.split` in the table's layout."""
    return dead.select(
        F.lit(pipeline).alias("pipeline"),
        F.lit(stage).alias("stage"),
        "source",
        "topic",
        F.col("partition").cast("int").alias("partition"),
        F.col("offset").cast("bigint").alias("offset"),
        F.col("kafka_timestamp").cast("timestamp").alias("kafka_timestamp"),
        F.col("key").cast("binary").alias("key"),
        F.col("raw").cast("binary").alias("raw"),
        "reason",
        batch_time().alias("recorded_at"),
    )
