"""Iceberg sinks that a replayed micro-batch cannot duplicate.

Structured Streaming may run a batch id again after a failure. Each write records who wrote it
and for which batch in the Iceberg snapshot's summary (``flow.writer``, ``flow.batch``); a write
whose pair is already committed is skipped. Counts travel in the same commit, so totals read
back from the table (``writer_totals``) hold across restarts.

A ledger that takes a commit every micro-batch keeps a bounded number of snapshots
(:class:`LedgerRetention`): every ``every`` batches a writer's commit also carries the roll-up of
its earlier commits' counts (``flow-rollup.*`` in the summary), and the snapshots that roll-up
covers are expired after it. Totals are the latest roll-up plus the commits after it, read from
one ``snapshots`` table (one metadata version): exact before, during and after an expiry. A
reader of the summaries reads them so (:func:`ledger_totals`); a plain sum of every snapshot's
``flow.*`` keys misses what was rolled up.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

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
    "LEDGER_RETENTION",
    "ROLLUP",
    "BatchLedger",
    "LedgerRetention",
    "append_once",
    "committed",
    "dead_letter_rows",
    "ensure_table",
    "expirable",
    "ledger_totals",
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


ROLLUP = "flow-rollup."
"""Prefix of a roll-up's keys in a snapshot summary: ``flow-rollup.batch`` (every commit of the
writer up to this batch is in it) and ``flow-rollup.<total>`` (``commits``, ``added-records``,
each ``flow.*`` count). Not ``flow.``: a per-batch count is any ``flow.*`` key."""


@dataclass(frozen=True)
class LedgerRetention:
    """Which of a writer's snapshots its ledger keeps.

    A ledger takes a commit a micro-batch (17,000 a day at a 5 s trigger) and every
    ``metadata.json`` lists every snapshot: +1.4 KB a batch, written and read at each commit
    (2.9 -> 58 MB of metadata over 1,500 batches of ``flow bench soak``). Expired are the
    writer's snapshots that a later roll-up covers, outside its last ``keep`` batches and older
    than ``min_age_s``: about ``every + keep`` snapshots stay a writer, or those of the last
    ``min_age_s``, whichever is more. Other writers' snapshots (and any without ``flow.writer``)
    are never touched."""

    every: int = 100
    """Batches whose id is a multiple of this carry the roll-up of the writer's earlier commits;
    an expiry follows each, on a thread (a Spark job reading the table's manifests: ~1-3 s on
    the 2-core machine). Smaller expires more often for fewer snapshots kept."""
    keep: int = 100
    """The writer's last this many batches are never expired: the run's report counts up to
    the batch both of its sinks committed (at most one behind the ledger's last), and whoever
    looks at the table's recent history sees its per-batch counts."""
    min_age_s: float = 600.0
    """A snapshot younger than this is never expired, whatever ``keep`` says: a reader plans a
    scan on the snapshot it loaded, and expiry deletes the manifest lists no kept snapshot
    names. Ten minutes, as the handoff log gives a segment (``SEGMENT_GRACE_S``)."""

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"LedgerRetention.every={self.every}: use 1 or more batches")
        if self.keep < 1:
            raise ValueError(
                f"LedgerRetention.keep={self.keep}: keep 1 or more batches (the last one holds "
                "the writer's last batch id, which replays are skipped by)"
            )
        if self.min_age_s < 0:
            raise ValueError(f"LedgerRetention.min_age_s={self.min_age_s}: use 0 or more")


LEDGER_RETENTION = LedgerRetention()
"""The dead-letter table's (the live stages' counts ledger)."""


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
    """Whether ``writer`` already committed ``batch`` to ``table`` (a batch at or below a
    roll-up counts as committed: its own snapshot may be expired)."""
    summary = F.col("summary")
    found = _commits(spark, table, writer).where(
        (summary["flow.batch"] == str(batch))
        | (summary[f"{ROLLUP}batch"].cast("bigint") >= F.lit(batch))
    )
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

    With a ``retention``, the writer's old snapshots are expired (see :class:`LedgerRetention`)
    on a thread of the ledger's own after the commit that rolls them up; the next append waits
    for it, so the ledger's own commits never race. :meth:`wait` before the session stops.
    """

    def __init__(
        self,
        spark: SparkSession,
        table: str,
        writer: str,
        retention: LedgerRetention | None = None,
        progress: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.spark = spark
        self.table = table
        self.writer = writer
        self.retention = retention
        self.progress = progress
        self._expiring: threading.Thread | None = None
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
        self.wait()
        retention = self.retention
        rollup = {}
        if retention is not None and batch % retention.every == 0:
            rollup = self._rollup(batch)
        _append(df, self.table, self.writer, batch, properties, few=few, rollup=rollup)
        self.last = batch
        if rollup:
            # A plain thread: not the stream's job group, which stopping the query cancels.
            self._expiring = threading.Thread(
                target=self._expire, name="ledger-expire", daemon=True
            )
            self._expiring.start()
        return True

    def wait(self) -> None:
        """Until the expiry in flight (if any) is done."""
        if self._expiring is not None:
            self._expiring.join()
            self._expiring = None

    def _rollup(self, batch: int) -> dict[str, str]:
        """Summary properties rolling up the writer's commits before ``batch``."""
        totals, upto = ledger_totals(_summaries(self.spark, self.table, self.writer), batch - 1)
        if upto < 0:
            return {}
        return {f"{ROLLUP}batch": str(upto)} | {f"{ROLLUP}{k}": str(v) for k, v in totals.items()}

    def _expire(self) -> None:
        retention = self.retention
        assert retention is not None
        try:
            started = time.monotonic()
            spark, table = self.spark, self.table
            found = (
                _commits(spark, table, self.writer)
                .select("snapshot_id", F.unix_millis("committed_at").alias("at"), "summary")
                .collect()
            )
            snapshots = [(r["snapshot_id"], r["at"], r["summary"]) for r in found]
            ids = expirable(snapshots, retention, now_ms=int(time.time() * 1000))
            if not ids:
                return
            catalog = table.partition(".")[0]
            # A thousand a call: a table older than this version may have a day's snapshots.
            for start in range(0, len(ids), 1000):
                listed = ", ".join(f"{i}L" for i in ids[start : start + 1000])
                # older_than: only the ids named; else Iceberg also expires every snapshot
                # older than history.expire.max-snapshot-age-ms (5 days), others' last ones too.
                spark.sql(
                    f"CALL {catalog}.system.expire_snapshots(table => '{table}', older_than => "
                    f"TIMESTAMP '2000-01-01 00:00:00', snapshot_ids => array({listed}))"
                ).collect()
            spark.catalog.refreshTable(table)
            self.progress(
                f"{table}: expired {len(ids):,} snapshots of {self.writer} that a roll-up of "
                f"their counts covers ({time.monotonic() - started:.1f}s, on a thread)"
            )
        except Exception as error:  # the next roll-up tries again; the counts are all there
            first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
            self.progress(
                f"{self.table}: expiring old snapshots of {self.writer} failed ({first}); "
                f"tried again in {retention.every} batches"
            )


def _append(
    df: DataFrame,
    table: str,
    writer: str,
    batch: int,
    properties: Mapping[str, int] | None,
    *,
    few: bool = False,
    rollup: Mapping[str, str] | None = None,
) -> None:
    options = {"snapshot-property.flow.writer": writer, "snapshot-property.flow.batch": str(batch)}
    options |= {f"snapshot-property.{k}": str(int(v)) for k, v in (properties or {}).items()}
    options |= {f"snapshot-property.{k}": v for k, v in (rollup or {}).items()}
    if few:
        df = df.coalesce(1)
        options["distribution-mode"] = "none"
    df.writeTo(table).options(**options).append()


def _summaries(spark: SparkSession, table: str, writer: str) -> list[dict[str, str]]:
    return [r["summary"] for r in _commits(spark, table, writer).select("summary").collect()]


def writer_totals(
    spark: SparkSession, table: str, writer: str, upto: int | None = None
) -> Counter[str]:
    """Sums over every commit of ``writer`` (of batches up to ``upto``, if given):
    ``commits``, ``added-records`` and each ``flow.*`` count (see :func:`ledger_totals`)."""
    if not spark.catalog.tableExists(table):
        return Counter()
    return ledger_totals(_summaries(spark, table, writer), upto)[0]


def ledger_totals(
    summaries: Iterable[Mapping[str, str]], upto: int | None = None
) -> tuple[Counter[str], int]:
    """The totals of one writer's commits (of batches up to ``upto``) from its snapshots'
    summaries, and the last batch counted (-1: none): the latest roll-up at or below ``upto``
    plus each commit after it. Exact as long as the commits after that roll-up are all there,
    which expiry keeps (:func:`expirable`: only what a present roll-up covers goes)."""
    commits: list[tuple[int, Mapping[str, str]]] = []
    base: Mapping[str, str] = {}
    base_batch = -1
    for summary in summaries:
        batch = int(summary.get("flow.batch") or -1)
        if upto is None or batch <= upto:
            commits.append((batch, summary))
        rolled = int(summary.get(f"{ROLLUP}batch") or -1)
        if base_batch < rolled and (upto is None or rolled <= upto):
            base, base_batch = summary, rolled
    totals: Counter[str] = Counter(
        {k.removeprefix(ROLLUP): int(v) for k, v in base.items() if k.startswith(ROLLUP)}
    )
    del totals["batch"]
    last = base_batch
    for batch, summary in commits:
        if batch <= base_batch:
            continue
        last = max(last, batch)
        totals["commits"] += 1
        totals["added-records"] += int(summary.get("added-records") or 0)
        for key, value in summary.items():
            if key.startswith("flow.") and key not in ("flow.writer", "flow.batch"):
                totals[key] += int(value)
    return totals, last


def expirable(
    snapshots: Sequence[tuple[int, int, Mapping[str, str]]],
    retention: LedgerRetention,
    now_ms: int,
) -> list[int]:
    """Of one writer's snapshots, (snapshot id, committed at in ms, summary) each, the ids to
    expire: covered by the latest roll-up (so :func:`ledger_totals` no longer reads them),
    outside the writer's last ``retention.keep`` batches and older than ``retention.min_age_s``.
    The roll-up's own snapshot is a later batch than it covers, so it stays."""
    rollups = [int(s[f"{ROLLUP}batch"]) for _, _, s in snapshots if f"{ROLLUP}batch" in s]
    if not rollups:
        return []
    covered = max(rollups)
    batches = sorted({int(s.get("flow.batch") or -1) for _, _, s in snapshots})
    recent = set(batches[-retention.keep :])
    cutoff = now_ms - retention.min_age_s * 1000
    return [
        snapshot_id
        for snapshot_id, at, summary in snapshots
        if (batch := int(summary.get("flow.batch") or -1)) <= covered
        and batch not in recent
        and at < cutoff
    ]


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
