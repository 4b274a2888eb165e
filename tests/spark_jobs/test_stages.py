"""Backfill and live stages on the real stack: labels, dead letters, enrichment, counts.

Small hand-made inputs whose right answers are known row by row.
"""

from __future__ import annotations

import errno
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from flow.config import StackConfig
from flow.errors import ConfigError, DeadLetterBudgetError
from flow.handoff import Channel, Commit
from flow.pipeline import (
    BackfillStage,
    Cross,
    Derived,
    Enrich,
    FeatureSpec,
    Field,
    HandoffOutput,
    Hashed,
    IcebergSource,
    KafkaSource,
    LabelJoin,
    LiveStage,
    Numeric,
    Pipeline,
    RunOptions,
    Source,
    TableOutput,
    Vocabulary,
)
from flow.pipeline.state import FeatureState, states_location
from flow.stack.iceberg import open_catalog
from flow.stack.kafka import ensure_topics, producer
from spark_jobs import backfill
from spark_jobs.backfill import run_backfill
from spark_jobs.features import training_rows
from spark_jobs.jvm import executed_plan
from spark_jobs.live import run as live_run
from spark_jobs.live import run_live
from spark_jobs.live.inplan import unsupported
from spark_jobs.live.plan import JOIN_STATE_FORMAT, TRACK_STATE_ROWS, LiveQuery
from spark_jobs.live.run import IN_PLAN
from spark_jobs.live.supervise import StreamFailedError
from spark_jobs.report import StageReport
from spark_jobs.rows import dead_letter_table, training_table
from spark_jobs.sinks import (
    LEDGER_PROPERTIES,
    BatchLedger,
    LedgerRetention,
    append_once,
    ensure_table,
    ledger_totals,
    writer_totals,
)
from spark_jobs.validate import parse_kafka
from tests.support import handoff_rows

pytestmark = pytest.mark.integration

# Three hours ago: recent enough for the live sources' bounds on event time (max_past), far
# enough back that every event time the tests use (up to T0 + 90 min) is in the past.
T0 = (datetime.now(UTC) - timedelta(hours=3)).replace(second=0, microsecond=0)
TS = pa.timestamp("us", tz="UTC")
LabelStrategy = Literal["window", "immediate"]
IMPRESSIONS = (
    Field("id", "string", required=True),
    Field("user_id", "long", required=True),
    Field("ts", "timestamp", required=True),
    Field("position", "int", min=1, max=50),
    Field("device", "string", allowed=("ios", "android", "web")),
)
CLICKS = (Field("id", "string", required=True), Field("ts", "timestamp", required=True))
USERS = (
    Field("user_id", "long", required=True),
    Field("country", "string"),
    Field("segment", "string"),
    Field("boost", "double"),
)
PYTHON_NODES = (
    "BatchEvalPython",
    "ArrowEvalPython",
    "PythonUDF",
    "MapInPandas",
    "MapInArrow",
    "InPandas",
)


def features(weight: str | float = 1.0) -> FeatureSpec:
    return FeatureSpec(
        "test_ctr",
        (
            Hashed("user_id", buckets=100),
            Vocabulary("user_country"),
            Cross(("user_country", "device"), buckets=64),
            Numeric("position", clip=(1, 50), log=True),
        ),
        passthrough=("id", "user_segment", "label_time", "produced_at"),
        weight=weight,
    )


def m(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


@dataclass
class Lake:
    stack: StackConfig
    ns: str

    def table(self, name: str, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
        catalog = open_catalog(self.stack.catalog)
        catalog.create_namespace_if_not_exists(self.ns)
        full = f"{self.ns}.{name}"
        if catalog.table_exists(full):
            catalog.load_table(full).overwrite(pa.Table.from_pylist(rows, schema=schema))
        else:
            catalog.create_table(full, schema=schema).append(
                pa.Table.from_pylist(rows, schema=schema)
            )

    def users(self, segment_of_1: str = "a") -> None:
        schema = pa.schema(
            [
                ("user_id", pa.int64()),
                ("country", pa.string()),
                ("segment", pa.string()),
                ("boost", pa.float64()),
            ]
        )
        self.table(
            "users",
            [
                {"user_id": 1, "country": "us", "segment": segment_of_1, "boost": 1.0},
                {"user_id": 2, "country": "de", "segment": "b", "boost": 2.0},
                {"user_id": 3, "country": "fr", "segment": "a", "boost": 0.0},
                {"user_id": 1, "country": "us", "segment": segment_of_1, "boost": 1.0},  # again
                {"user_id": 4, "country": "us", "segment": "c", "boost": 1.0},
            ],
            schema,
        )

    def pipeline(
        self,
        strategy: LabelStrategy = "window",
        weight: str | float = 1.0,
        on_missing: Literal["keep", "dead_letter"] = "keep",
        max_dead_share: float = 1.0,
        **live: Any,
    ) -> Pipeline:
        topic = f"{self.ns}.impressions"
        users = IcebergSource(f"{self.ns}.users", USERS)
        sources: dict[str, Source] = {
            "hist": IcebergSource(f"{self.ns}.impressions_history", IMPRESSIONS, event_time="ts"),
            "hist_clicks": IcebergSource(f"{self.ns}.clicks_history", CLICKS, event_time="ts"),
            "impressions": KafkaSource(
                topic, IMPRESSIONS, event_time="ts", watermark="1 minute", max_payload_bytes=2048
            ),
            "clicks": KafkaSource(
                f"{self.ns}.clicks", CLICKS, event_time="ts", watermark="1 minute"
            ),
            "users": users,
        }
        enrich = (
            Enrich(
                "users",
                on="user_id",
                columns=("country", "segment", "boost"),
                prefix="user_",
                on_missing=on_missing,
            ),
        )
        return Pipeline(
            "test",
            self.ns,
            sources,
            (
                BackfillStage(
                    "backfill",
                    events="hist",
                    label=LabelJoin("hist_clicks", key="id", window="30 minutes"),
                    enrich=enrich,
                    features=features(weight),
                    channel="backfill",
                    # A world of a few rows, many of them bad on purpose: no budget.
                    max_dead_share=max_dead_share,
                ),
                LiveStage(
                    "live",
                    events="impressions",
                    label=LabelJoin("clicks", key="id", window="10 minutes", strategy=strategy),
                    enrich=enrich,
                    features=features(weight),
                    channel="live",
                    **live,
                ),
            ),
        )

    def send(self, topic: str, records: list[Any]) -> None:
        out = producer(self.stack.kafka)
        for record in records:
            payload = (
                record if isinstance(record, bytes) else json.dumps(record, default=str).encode()
            )
            out.produce(f"{self.ns}.{topic}", payload)
        assert out.flush(30) == 0


@pytest.fixture
def world(running_stack: StackConfig) -> Lake:
    ns = f"t{uuid.uuid4().hex[:8]}"
    w = Lake(running_stack, ns)
    ensure_topics(running_stack.kafka, [f"{ns}.impressions", f"{ns}.clicks"], partitions=2)
    imp_schema = pa.schema(
        [
            ("id", pa.string()),
            ("user_id", pa.int64()),
            ("ts", TS),
            ("position", pa.int32()),
            ("device", pa.string()),
        ]
    )
    w.table(
        "impressions_history",
        [
            {"id": "i1", "user_id": 1, "ts": m(0), "position": 1, "device": "ios"},
            {"id": "i2", "user_id": 2, "ts": m(1), "position": 2, "device": "web"},
            {"id": "i3", "user_id": 1, "ts": m(2), "position": 3, "device": "ios"},
            {"id": "i4", "user_id": 3, "ts": m(3), "position": 4, "device": None},
            {"id": "i5", "user_id": None, "ts": m(4), "position": 5, "device": "ios"},
            {"id": "i6", "user_id": 2, "ts": m(5), "position": 99, "device": "ios"},
            {"id": "i7", "user_id": 9, "ts": m(6), "position": 1, "device": "android"},
            {"id": "i8", "user_id": 1, "ts": m(7), "position": 1, "device": "toaster"},
        ],
        imp_schema,
    )
    w.table(
        "clicks_history",
        [
            {"id": "i1", "ts": m(5)},
            {"id": "i2", "ts": m(46)},  # beyond the 30-minute window
            {"id": "i3", "ts": m(3)},
            {"id": "i3", "ts": m(4)},  # a second click on i3 counts once
            {"id": "i99", "ts": m(0)},  # no such impression
            {"id": None, "ts": m(1)},  # broken
        ],
        pa.schema([("id", pa.string()), ("ts", TS)]),
    )
    w.users()
    return w


def rows_of(world: Lake, channel: str) -> dict[str, dict[str, Any]]:
    """The channel's training rows by id (never more than one per id)."""
    where = f"{world.stack.handoff}/{world.ns}"
    if not Channel(where, channel).exists():
        return {}
    found = handoff_rows(where, channel).to_pylist()
    ids = [r["id"] for r in found]
    assert len(ids) == len(set(ids)), f"duplicated training rows: {sorted(ids)}"
    return {r["id"]: r for r in found}


def _ledger_count(spark: SparkSession, world: Lake, key: str) -> int:
    """``key`` summed over the dead-letter table's commits so far (every writer's)."""
    table = dead_letter_table(world.stack, world.pipeline())
    if not spark.catalog.tableExists(table):
        return 0
    spark.catalog.refreshTable(table)
    by_writer: dict[str, list[dict[str, str]]] = {}
    for row in spark.sql(f"SELECT summary FROM {table}.snapshots").collect():
        by_writer.setdefault(row["summary"].get("flow.writer", ""), []).append(row["summary"])
    # Per writer, its latest roll-up and the commits after it (old snapshots may be expired).
    return sum(ledger_totals(found)[0][key] for found in by_writer.values())


def rows_of_all(world: Lake) -> list[dict[str, Any]]:
    """Every row of the live channel (immediate labels: an event's negative and positive)."""
    where = f"{world.stack.handoff}/{world.ns}"
    return handoff_rows(where, "live").to_pylist() if Channel(where, "live").exists() else []


def dead_reasons(spark: SparkSession, world: Lake, stage: str) -> list[str]:
    table = dead_letter_table(world.stack, world.pipeline())
    spark.catalog.refreshTable(table)
    return sorted(r.reason for r in spark.table(table).where(F.col("stage") == stage).collect())


def assert_no_python(df: DataFrame) -> None:
    plan = str(executed_plan(df).toString())
    assert not [node for node in PYTHON_NODES if node in plan], plan


def test_backfill_labels_validates_enriches_fits_and_reconciles(
    spark: SparkSession, world: Lake
) -> None:
    pipeline = world.pipeline()
    stage = pipeline.stage("backfill", BackfillStage)
    report, state = run_backfill(spark, pipeline, stage, world.stack)

    assert (report.events_input, report.events_dead, report.training_rows) == (8, 3, 5)
    assert (report.labels_input, report.labels_dead) == (6, 1)
    assert report.reconciled
    rows = rows_of(world, "backfill")
    assert {k: r["label"] for k, r in rows.items()} == {
        "i1": 1.0,
        "i2": 0.0,
        "i3": 1.0,
        "i4": 0.0,
        "i7": 0.0,
    }
    assert rows["i7"]["user_segment"] is None, (
        "an unknown user enriches to nulls, not to a lost row"
    )
    assert report.dimension_misses == {"users": 1}  # i7's user 9: kept, counted
    assert report.metrics()["missing.users"] == 1
    assert all(len(r["sparse"]) == 3 and len(r["dense"]) == 1 for r in rows.values())
    assert all(0 < r["sparse"][0] < 100 for r in rows.values())
    assert dead_reasons(spark, world, "backfill") == [
        "field 'device' = 'toaster' is not one of ios, android, web",
        "field 'position' = 99 is above the maximum 50",
        "missing required field 'id'",
        "missing required field 'user_id'",
    ]
    # Fitted on the valid rows only; the most frequent value first.
    assert state.vocabularies["user_country"][0] == "us"
    assert FeatureState.load(states_location(world.stack, world.ns), stage.features) == state

    again, _ = run_backfill(spark, pipeline, stage, world.stack)
    assert (again.training_rows, again.events_dead) == (5, 3)
    assert len(dead_reasons(spark, world, "backfill")) == 4, "a rerun replaces, never adds"
    assert len(rows_of(world, "backfill")) == 5, "the same snapshots are committed once"
    channel = Channel(f"{world.stack.handoff}/{world.ns}", "backfill")
    assert channel.commit_ids() == [0]
    assert channel.closed(), "a finished backfill lets its followers end"
    assert channel.meta().layout is not None
    assert channel.meta().feature_state == state.version


def test_a_full_backfill_of_new_snapshots_is_refused_and_tables_remain_an_option(
    spark: SparkSession, world: Lake
) -> None:
    pipeline = world.pipeline()
    stage = pipeline.stage("backfill", BackfillStage)
    run_backfill(spark, pipeline, stage, world.stack)
    world.users(segment_of_1="q")  # a new snapshot of a source: other rows, same channel
    with pytest.raises(ConfigError, match="a full backfill would add those rows again"):
        run_backfill(spark, pipeline, stage, world.stack)
    tables = replace(pipeline, output=TableOutput())
    report, _ = run_backfill(spark, tables, stage, world.stack)
    assert (
        spark.table(training_table(world.stack, tables, "backfill")).count()
        == report.training_rows
        == 5
    )


def test_a_backfill_with_more_dead_letters_than_its_bound_fails_and_writes_nothing(
    spark: SparkSession, world: Lake
) -> None:
    # 3 of the 8 events are dead letters (37.5 %), over a bound of 5 %, the default.
    pipeline = world.pipeline(max_dead_share=0.05)
    stage = pipeline.stage("backfill", BackfillStage)
    with pytest.raises(DeadLetterBudgetError) as raised:
        run_backfill(spark, pipeline, stage, world.stack)
    said = str(raised.value)
    assert said.startswith("backfill: 3 of 8 hist rows (37.5%) are dead letters, over the")
    assert "the most common reason: " in said
    assert "e.g. {" in said  # an example row
    assert "max_dead_share=" in said
    assert "\n" not in said
    assert not Channel(f"{world.stack.handoff}/{world.ns}", "backfill").exists()
    states = Path(states_location(world.stack, world.ns).path)  # probed for writing, no more
    assert not [f for f in states.rglob("*") if f.is_file()], "nothing was fitted"


def test_a_label_of_1_to_5_stops_a_backfill_on_a_sample_before_it_reads_every_row(
    spark: SparkSession, world: Lake
) -> None:
    schema = pa.schema([("user_id", pa.int64()), ("ts", TS), ("label", pa.int64())])
    world.table(
        "ratings",
        [{"user_id": n % 7, "ts": m(n / 60), "label": n % 5 + 1} for n in range(3_000)],
        schema,
    )
    fields = (Field("user_id", "long"), Field("ts", "timestamp"), Field("label", "long"))
    spec = FeatureSpec("stars", (Hashed("user_id", buckets=16),))
    pipeline = Pipeline(
        "stars",
        world.ns,
        {"ratings": IcebergSource(f"{world.ns}.ratings", fields, event_time="ts")},
        (BackfillStage("backfill", events="ratings", features=spec, channel="stars"),),
    )
    with pytest.raises(DeadLetterBudgetError) as raised:
        run_backfill(spark, pipeline, pipeline.stage("backfill", BackfillStage), world.stack)
    said = str(raised.value)
    # The sample's count (the first 1,000 rows), not the full count over 3,000.
    assert said.startswith("backfill: 800 of the first 1,000 labels of ratings (80%) are not 0")
    assert "Derived('label', 'rating >= 4', type='int')" in said
    assert "\n" not in said
    assert not Channel(f"{world.stack.handoff}/{world.ns}", "stars").exists()


def test_an_unwritable_handoff_stops_a_backfill_before_it_reads_or_fits(
    spark: SparkSession, world: Lake, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a folder under a file cannot be made, even by root
    pipeline = world.pipeline()
    with pytest.raises(ConfigError, match=rf"^FLOW_HANDOFF: cannot write to {blocker}/"):
        run_backfill(
            spark,
            pipeline,
            pipeline.stage("backfill", BackfillStage),
            replace(world.stack, handoff=str(blocker)),
        )
    assert not states_location(world.stack, world.ns).exists(), "nothing was fitted"


def test_a_stage_that_fails_after_fitting_leaves_latest_on_the_last_good_state(
    spark: SparkSession, world: Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = world.pipeline()
    stage = pipeline.stage("backfill", BackfillStage)
    _, good = run_backfill(spark, pipeline, stage, world.stack)
    states = states_location(world.stack, world.ns)
    # New users, so the refit's vocabulary differs; its rows go to a new handoff location, whose
    # export fails (a full disk, a lost bucket) after the fit.
    world.table(
        "users",
        [{"user_id": 2, "country": "jp", "segment": "b"}],
        pa.schema([("user_id", pa.int64()), ("country", pa.string()), ("segment", pa.string())]),
    )

    def export_fails(*_args: object, **_kwargs: object) -> None:
        raise OSError("no space left on device")

    monkeypatch.setattr(backfill, "export", export_fails)
    elsewhere = replace(pipeline, output=HandoffOutput(location=str(tmp_path / "handoff")))
    with pytest.raises(OSError, match="no space left"):
        run_backfill(spark, elsewhere, stage, world.stack)
    monkeypatch.undo()
    versions = states.child(stage.features.name).list(".json")
    assert len(versions) == 2, "the refit is saved under its version all the same"
    assert FeatureState.load(states, stage.features) == good, "LATEST did not move"

    # A later run that loads LATEST gets the last good state.
    tables = replace(pipeline, output=TableOutput())
    report, used = run_backfill(spark, tables, replace(stage, fit=False), world.stack)
    assert used == good
    assert report.feature_state == good.version


def test_features_and_parsing_run_no_python_per_row(spark: SparkSession, world: Lake) -> None:
    pipeline = world.pipeline()
    _, state = run_backfill(spark, pipeline, pipeline.stage("backfill", BackfillStage), world.stack)
    enriched = spark.createDataFrame(
        [("x", 1, "us", "a", "ios", 3, 1.0, None, None)],
        "id string, user_id bigint, user_country string, user_segment string, device string, "
        "position int, label double, label_time timestamp, produced_at timestamp",
    )
    assert_no_python(training_rows(enriched, features(), state))
    raw = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", world.stack.kafka.bootstrap_servers)
        .option("subscribe", f"{world.ns}.impressions")
        .load()
    )
    source = pipeline.sources["impressions"]
    assert isinstance(source, KafkaSource)
    assert_no_python(parse_kafka(raw, source, "impressions"))


def test_a_replayed_batch_commits_nothing(spark: SparkSession, world: Lake) -> None:
    table = f"{world.stack.catalog.name}.{world.ns}.replay"
    spark.sql(f"CREATE TABLE {table} (a bigint) USING iceberg")
    batch = spark.range(3).withColumnRenamed("id", "a")
    assert append_once(batch, table, "w1", 7, {"flow.n": 3})
    assert not append_once(batch, table, "w1", 7, {"flow.n": 3})
    assert append_once(batch, table, "w2", 7)  # another writer's batch 7 is its own
    assert spark.table(table).count() == 6
    # A stream's ledger, opened after a restart, knows batch 7 and skips its replay.
    ledger = BatchLedger(spark, table, "w1")
    assert ledger.last == 7
    assert not ledger.append(batch, 7)
    assert ledger.append(batch, 8, {"flow.n": 3})
    assert spark.table(table).count() == 9
    assert writer_totals(spark, table, "w1")["flow.n"] == 6


def test_a_ledger_keeps_its_last_metadata_files_and_an_old_one_is_given_the_setting(
    spark: SparkSession, world: Lake
) -> None:
    # A ledger commits every micro-batch; Iceberg keeps every metadata.json unless told.
    keep = {"write.metadata.delete-after-commit.enabled": "true",
            "write.metadata.previous-versions-max": "2"}  # fmt: skip
    assert set(keep) == set(LEDGER_PROPERTIES)
    schema = StructType([StructField("a", LongType())])
    catalog = open_catalog(world.stack.catalog)
    batch = spark.range(1).withColumnRenamed("id", "a")

    def metadata_files(name: str) -> int:
        where = catalog.load_table(f"{world.ns}.{name}").location().removeprefix("file://")
        return len(list(Path(where, "metadata").glob("*.metadata.json")))

    for name, made_before in (("new_ledger", False), ("old_ledger", True)):
        table = f"{world.stack.catalog.name}.{world.ns}.{name}"
        if made_before:  # a table of an earlier version: made without the setting
            ensure_table(spark, table, schema)
        ensure_table(spark, table, schema, properties=keep)
        ledger = BatchLedger(spark, table, "w1")
        for batch_id in range(6):
            ledger.append(batch, batch_id, few=True)
        assert metadata_files(name) <= 3, name  # the current one and the last two
        assert writer_totals(spark, table, "w1")["commits"] == 6  # every snapshot is kept
    # A value set on the table is the table's: never changed.
    ensure_table(spark, table, schema, properties={"write.metadata.previous-versions-max": "9"})
    shown = spark.sql(f"SHOW TBLPROPERTIES {table}").collect()
    assert {r["key"]: r["value"] for r in shown}["write.metadata.previous-versions-max"] == "2"


def test_a_ledger_expires_the_snapshots_a_roll_up_of_their_counts_covers(
    spark: SparkSession, world: Lake
) -> None:
    # flow bench soak: the ledger's metadata.json listed every snapshot (+1.4 KB a batch, 58 MB
    # after 1,500). The counts live in the summaries: rolled up, then expired, never lost.
    table = f"{world.stack.catalog.name}.{world.ns}.expiring_ledger"
    ensure_table(spark, table, StructType([StructField("a", LongType())]), "", LEDGER_PROPERTIES)
    catalog = open_catalog(world.stack.catalog)
    batch = spark.range(1).withColumnRenamed("id", "a")
    retention = LedgerRetention(every=5, keep=3, min_age_s=0)
    said: list[str] = []
    ledger = BatchLedger(spark, table, "w1", retention, said.append)
    BatchLedger(spark, table, "w2").append(batch, 0, {"flow.n": 100}, few=True)  # not w1's

    def held() -> tuple[int, int]:
        spark.catalog.refreshTable(table)
        snapshots = spark.table(f"{table}.snapshots").count()
        where = catalog.load_table(f"{world.ns}.expiring_ledger").metadata_location
        return snapshots, Path(where.removeprefix("file:").removeprefix("//")).stat().st_size

    sizes = {}
    for batch_id in range(30):
        ledger.append(batch, batch_id, {"flow.n": batch_id}, few=True)
        if batch_id == 25:  # a reader while the expiry runs reads every count once
            assert writer_totals(spark, table, "w1")["flow.n"] == sum(range(26))
        if batch_id in (14, 29):
            ledger.wait()
            sizes[batch_id] = held()
    assert sizes[29][0] <= retention.every + retention.keep + 2, (sizes, said)  # w2's, too
    assert sizes[29][1] <= sizes[14][1] * 1.1, sizes
    assert any("expired" in line for line in said), said
    totals = writer_totals(spark, table, "w1")
    assert (totals["commits"], totals["added-records"]) == (30, 30)
    assert totals["flow.n"] == sum(range(30))
    assert writer_totals(spark, table, "w1", upto=28)["flow.n"] == sum(range(29))
    assert writer_totals(spark, table, "w2")["flow.n"] == 100  # another writer's: all kept
    assert spark.table(table).count() == 31  # expiry deletes no row
    # A restart knows the last batch; a replay of an old, expired one is still a no-op.
    again = BatchLedger(spark, table, "w1", retention)
    assert again.last == 29
    assert not again.append(batch, 29)
    assert not append_once(batch, table, "w1", 3)


def _two_impressions_a_bad_record_and_a_click(world: Lake) -> None:
    world.send(
        "impressions",
        [
            {"id": "e1", "user_id": 1, "ts": m(0), "position": 1, "device": "ios"},
            {"id": "e2", "user_id": 2, "ts": m(1), "position": 2, "device": "web"},
            b"not json",
        ],
    )
    world.send("clicks", [{"id": "e1", "ts": m(0.5)}])


@pytest.mark.parametrize("strategy", ["window", "immediate"])
def test_a_live_stage_reads_each_topic_once_a_batch(
    rocksdb: SparkSession, world: Lake, tmp_path: Path, strategy: LabelStrategy
) -> None:
    """The stage's plan uses a topic's records two or three times (the accounting, the join;
    ``immediate`` pairs the events with the clicks again, in its processor); Spark's own count
    of rows read says each record is read once, the bad one included."""
    spark = rocksdb  # the stage's store (the immediate strategy's processor needs it)
    pipeline = world.pipeline(strategy)
    stage = pipeline.stage("live", LiveStage)
    _two_impressions_a_bad_record_and_a_click(world)
    stage_query = LiveQuery(spark, world.stack, pipeline, stage, RunOptions())
    seen: list[int] = []
    query = (
        stage_query.stream_frame()
        .writeStream.foreachBatch(lambda batch, _id: seen.append(batch.count()))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    read = sum(int(p["numInputRows"]) for p in (json.loads(q.json) for q in query.recentProgress))
    assert read == 4, f"Spark read {read} rows for 4 records: a topic was read more than once"
    assert sum(seen) >= 4  # every record is in its batch (and the joined rows beside them)


def test_a_full_disk_stops_a_live_stage_at_once_and_its_last_line_names_it(
    spark: SparkSession, live_world: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default path's training commit (immediate labels) meets a full disk: Spark passes
    the batch function's error on as a traceback's text; the stage's error names the cause and
    what to change in one line and restarts nothing. (Both writers are called through the same
    recording wrapper, LiveQuery.start; the window strategy's passed too, left out for CI's
    time.)"""
    world = live_world
    pipeline = world.pipeline("immediate")
    stage = pipeline.stage("live", LiveStage)
    _two_impressions_a_bad_record_and_a_click(world)

    def full(self: Channel, commit: Commit) -> Commit | None:
        raise OSError(errno.ENOSPC, "No space left on device", str(self.root))

    monkeypatch.setattr(Channel, "add_commit", full)
    said: list[str] = []
    with pytest.raises(StreamFailedError) as failed:
        run_live(
            spark, pipeline, stage, world.stack, RunOptions(max_restarts=3), progress=said.append
        )
    message = str(failed.value)
    assert message.startswith(
        "live stage 'live' stopped, not restarted: OSError: [Errno 28] No space left on device"
    ), message
    assert "free space where the stage writes" in message
    assert "\n" not in message
    assert not [line for line in said if "restart" in line], said


def test_a_live_stage_writing_inside_its_plan_reads_each_topic_once_a_batch(
    spark: SparkSession, live_world: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With its writes inside the streaming plan (spark_jobs.live.inplan) the stage still reads
    each topic once: Spark's count of the rows it scanned equals the records counted, and the
    counts reconcile. Its dead letters reach the ledger's write from a file, not in the write's
    task (a local relation: MBs a batch with oversized records)."""
    appended: list[str] = []
    append = BatchLedger.append

    def seen(self: BatchLedger, df: DataFrame, *args: Any, **kwargs: Any) -> bool:
        appended.append(str(executed_plan(df).toString()))
        return append(self, df, *args, **kwargs)

    monkeypatch.setattr(BatchLedger, "append", seen)
    world = live_world
    pipeline = world.pipeline()
    stage = pipeline.stage("live", LiveStage)
    events = pipeline.sources[stage.events]
    assert isinstance(events, KafkaSource)
    assert unsupported(pipeline, stage, events) is None
    _two_impressions_a_bad_record_and_a_click(world)
    batches: list[dict[str, float]] = []
    report = run_live(
        spark,
        pipeline,
        stage,
        world.stack,
        RunOptions(),
        on_batch=lambda metrics, _batch: batches.append(metrics),
    )
    scanned = sum(b.get("batch_rows_scanned", 0.0) for b in batches)
    assert scanned == 4, f"Spark read {scanned} rows for 4 records: a topic was read twice"
    assert (report.events_input, report.labels_input, report.events_dead) == (3, 1, 1)
    assert appended
    assert not [plan for plan in appended if "LocalTableScan" in plan], appended
    assert report.reconciled


class LiveRun:
    """run_live in a background thread, continuous, until told to stop."""

    def __init__(
        self,
        spark: SparkSession,
        world: Lake,
        pipeline: Pipeline,
        progress: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.stop_event = threading.Event()
        self.result: list[StageReport] = []
        self.error: list[BaseException] = []
        stage = pipeline.stage("live", LiveStage)

        def target() -> None:
            try:
                options = RunOptions(mode="continuous")
                self.result.append(
                    run_live(
                        spark,
                        pipeline,
                        stage,
                        world.stack,
                        options,
                        progress=progress,
                        stop=self.stop_event.is_set,
                    )
                )
            except BaseException as exc:  # surfaced in the test thread
                self.error.append(exc)

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def finish(self) -> StageReport:
        self.stop_event.set()
        self.thread.join(timeout=120)
        if self.error:
            raise self.error[0]
        return self.result[0]


def wait_for(check: Callable[[], bool], what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(1)


@pytest.fixture
def live_world(spark: SparkSession, world: Lake) -> Lake:
    """A world whose feature state the backfill has fitted."""
    pipeline = world.pipeline()
    run_backfill(spark, pipeline, pipeline.stage("backfill", BackfillStage), world.stack)
    return world


def test_a_live_stage_labels_late_clicks_sees_dimension_updates_and_reconciles(
    spark: SparkSession, live_world: Lake
) -> None:
    world = live_world
    pipeline = world.pipeline(trigger="1 second")

    def ids() -> set[str]:
        return set(rows_of(world, "live"))

    run = LiveRun(spark, world, pipeline)
    try:
        # Batch A: three impressions, an immediate click on e1, broken records of every kind.
        world.send(
            "impressions",
            [
                {"id": "e1", "user_id": 1, "ts": m(0), "position": 1, "device": "ios"},
                {"id": "e2", "user_id": 2, "ts": m(1), "position": 2, "device": "web"},
                {"id": "e3", "user_id": 3, "ts": m(2), "position": 3, "device": "android"},
                b"\x00not json at all",
                {"id": "b1", "ts": m(2), "position": 1},
                {"id": "b2", "user_id": "abc", "ts": m(2)},
                {"id": "b3", "user_id": 1, "ts": m(2), "position": -1},
                {"id": "b4", "user_id": 1, "ts": m(2), "pad": "x" * 3000},
            ],
        )
        world.send("clicks", [{"id": "e1", "ts": m(0.5)}, {"id": "e2"}])
        wait_for(lambda: "e1" in ids(), "e1's positive")

        # While the stream runs: user 1 changes segment; a late click for e3 (within its
        # window), a click for e2 after its window, and events that move the watermark on.
        world.users(segment_of_1="z")
        world.send(
            "impressions", [{"id": "e10", "user_id": 1, "ts": m(5), "position": 1, "device": "ios"}]
        )
        world.send("clicks", [{"id": "e3", "ts": m(10)}, {"id": "e2", "ts": m(13)}])
        world.send(
            "impressions", [{"id": "e9", "user_id": 4, "ts": m(40), "position": 1, "device": "web"}]
        )
        world.send("clicks", [{"id": "nobody", "ts": m(40)}])
        wait_for(lambda: {"e2", "e3", "e10"} <= ids(), "the rest of the rows")
    finally:
        report = run.finish()

    rows = rows_of(world, "live")
    assert {k: r["label"] for k, r in rows.items()} == {"e1": 1.0, "e2": 0.0, "e3": 1.0, "e10": 0.0}
    assert rows["e1"]["user_segment"] == "a"
    assert rows["e10"]["user_segment"] == "z", "the dimension update was not seen by the stream"
    reasons = dead_reasons(spark, world, "live")
    assert len(reasons) == 6
    assert any(r.startswith("not a JSON object: '") for r in reasons)
    assert "missing required field 'user_id'" in reasons
    assert any("field 'user_id' has value 'abc', which is not a long" in r for r in reasons)
    assert "field 'position' = -1 is below the minimum 1" in reasons
    assert any(r.startswith("oversized record: ") for r in reasons)
    assert "missing required field 'ts'" in reasons  # the broken click
    assert (report.events_input, report.training_rows, report.events_dead) == (10, 4, 5)
    assert report.pending == 1  # e9 waits for its window
    assert report.reconciled
    # What a served model needs of the features, recorded with the channel; no raw example
    # rows (a live stage's exist only inside its streaming plan).
    recorded = Channel(f"{world.stack.handoff}/{world.ns}", "live").features()
    assert recorded is not None
    assert set(recorded["inputs"]) == {"user_id", "user_country", "device", "position"}
    assert recorded["example"] == []

    # A restart resumes from the checkpoint: e9 comes out, nothing is read or written twice.
    world.send(
        "impressions", [{"id": "e11", "user_id": 2, "ts": m(41), "position": 1, "device": "ios"}]
    )
    world.send(
        "impressions", [{"id": "e12", "user_id": 2, "ts": m(90), "position": 1, "device": "ios"}]
    )
    world.send("clicks", [{"id": "nobody", "ts": m(90)}])
    stage = pipeline.stage("live", LiveStage)
    resumed = run_live(spark, pipeline, replace(stage), world.stack, RunOptions())
    assert set(rows_of(world, "live")) == {"e1", "e2", "e3", "e10", "e9", "e11"}
    assert (resumed.events_input, resumed.training_rows, resumed.events_dead, resumed.pending) == (
        12,
        6,
        5,
        1,
    )
    assert resumed.reconciled


def test_what_is_pending_is_checked_against_the_events_the_label_join_holds(
    spark: SparkSession, live_world: Lake
) -> None:
    """Spark's RocksDB count of the rows in state is off (it costs a read before every write):
    the report reads the label join's state from the checkpoint instead, and what it counts as
    pending must be among the events held there."""
    world = live_world
    pipeline = world.pipeline()
    stage = pipeline.stage("live", LiveStage)
    rounds = [
        (  # e0-e3 wait in the join (e1 with its click); the repeat of e1 is dropped
            [
                {"id": f"e{i}", "user_id": 1, "ts": m(i), "position": 1, "device": "ios"}
                for i in range(4)
            ]
            + [{"id": "e1", "user_id": 1, "ts": m(1), "position": 1, "device": "ios"}],
            [{"id": "e1", "ts": m(1.5)}],
            4,
            3,
        ),
        (  # the watermark passes e0-e3's window: they leave; e20 is labelled and held
            [{"id": "e20", "user_id": 2, "ts": m(20), "position": 1, "device": "web"}],
            [{"id": "e20", "ts": m(20.5)}, {"id": "x", "ts": m(20)}],
            1,
            0,
        ),
        (  # e40 waits; e20 stays, as no click moved the clicks' watermark (the smaller wins)
            [{"id": "e40", "user_id": 3, "ts": m(40), "position": 1, "device": "web"}],
            [],
            2,
            1,
        ),
    ]
    metrics: list[dict[str, float]] = []
    for impressions, clicks, held, pending in rounds:
        world.send("impressions", impressions)
        world.send("clicks", clicks)
        report = live_run.LiveRun(
            spark,
            pipeline,
            replace(stage),
            world.stack,
            RunOptions(),
            print,
            lambda batch_metrics, _batch: metrics.append(batch_metrics),
            lambda: False,
        ).run()
        assert (report.pending_bound, report.pending) == (held, pending)
        assert report.extra["events_in_join"] == held
        assert report.reconciled
    assert spark.conf.get(TRACK_STATE_ROWS) == "false"
    assert spark.conf.get(JOIN_STATE_FORMAT) == "3"  # and the join's state was read back above
    assert metrics
    assert not [m for m in metrics if "state_rows" in m]  # Spark's count would say 0
    assert {k: r["label"] for k, r in rows_of(world, "live").items()} == {
        "e0": 0.0,
        "e1": 1.0,
        "e2": 0.0,
        "e3": 0.0,
        "e20": 1.0,
    }


def test_immediate_labels_emit_each_event_at_once_and_its_positive_when_the_click_comes(
    spark: SparkSession, live_world: Lake
) -> None:
    world = live_world
    pipeline = world.pipeline("immediate", trigger="1 second")
    where = f"{world.stack.handoff}/{world.ns}"

    def emitted() -> set[tuple[str, float]]:
        return {(r["id"], r["label"]) for r in rows_of_all(world)}

    run = LiveRun(spark, world, pipeline)
    try:
        world.send(
            "impressions",
            [
                {"id": "e1", "user_id": 1, "ts": m(0), "position": 1, "device": "ios"},
                {"id": "e2", "user_id": 2, "ts": m(1), "position": 2, "device": "web"},
                {"id": "e3", "user_id": 3, "ts": m(2), "position": 3, "device": "android"},
                {"id": "e1", "user_id": 1, "ts": m(0), "position": 1, "device": "ios"},  # again
                {"id": "b1", "ts": m(2), "position": 1},  # no user_id: a dead letter
            ],
        )
        # No click yet, and the watermark far from the ends of their windows: the window
        # strategy would hold all three; this one emits them now, as negatives.
        wait_for(lambda: {("e1", 0.0), ("e2", 0.0), ("e3", 0.0)} <= emitted(), "the negatives")
        # After the first batch the watermark is m(2) - 1 minute: a click before m(1) would be
        # late (judged by a later batch, once a no-data batch has moved the watermark on).
        world.send(
            "clicks",
            [
                {"id": "e1", "ts": m(1.5)},
                {"id": "e3", "ts": m(5)},
                {"id": "e3", "ts": m(6)},  # a second click counts once
                {"id": "e2", "ts": m(13)},  # after e2's 10-minute window: no positive
            ],
        )
        wait_for(lambda: {("e1", 1.0), ("e3", 1.0)} <= emitted(), "the positives")
        world.send(
            "impressions", [{"id": "e9", "user_id": 4, "ts": m(40), "position": 1, "device": "web"}]
        )
        world.send("clicks", [{"id": "nobody", "ts": m(40)}])  # moves the watermark past e2's
        wait_for(lambda: ("e9", 0.0) in emitted(), "e9")
        # e2's click leaves the join's state, having labelled nothing, once the watermark has
        # passed it (a batch of its own, with no data): counted then.
        wait_for(lambda: _ledger_count(spark, world, "flow.unmatched.clicks") == 1, "e2's click")
    finally:
        report = run.finish()

    found = rows_of_all(world)
    assert sorted((r["id"], r["label"]) for r in found) == [
        ("e1", 0.0),
        ("e1", 1.0),
        ("e2", 0.0),
        ("e3", 0.0),
        ("e3", 1.0),
        ("e9", 0.0),
    ]
    by_kind = {(r["id"], r["label"]): r for r in found}
    assert by_kind[("e1", 1.0)]["label_time"] == m(1.5)
    # Which of e3's two clicks is kept when both come in one batch is Spark's order (the
    # deduplication keeps the first it meets): either is a click within the window.
    assert by_kind[("e3", 1.0)]["label_time"] in (m(5), m(6))
    assert all(r["label_time"] is None for r in found if r["label"] == 0.0)
    # Produced: the Kafka record's time; a positive's is its click's, after its impression's.
    assert all(r["produced_at"] is not None for r in found)
    assert by_kind[("e1", 1.0)]["produced_at"] > by_kind[("e1", 0.0)]["produced_at"]
    assert Channel(where, "live").meta().label_strategy == "immediate"
    assert (report.events_input, report.events_dead, report.duplicates) == (6, 1, 1)
    assert (report.training_rows, report.positives, report.relabelled) == (6, 2, 2)
    assert report.pending == 0  # nothing waits for a window
    assert report.reconciled
    assert report.lineage["label_strategy"] == "immediate"
    # The default path's writer: the writes inside the streaming plan, one job a batch.
    assert report.tags == {"flow.live.writer": "inplan", "flow.live.writer_reason": IN_PLAN}
    # Of five clicks: two positives, a repeat, e2's (after its window) labelled nothing, and
    # the last still in the join's state (the watermark has not passed it).
    assert (report.labels_input, report.labels_dead, report.labels_unmatched) == (5, 0, 1)
    assert report.metrics()["labels_unmatched"] == 1.0


def test_events_whose_dimension_key_is_unknown_can_be_dead_letters(
    spark: SparkSession, world: Lake
) -> None:
    pipeline = world.pipeline("immediate", on_missing="dead_letter", trigger="1 second")
    report, _ = run_backfill(
        spark, pipeline, pipeline.stage("backfill", BackfillStage), world.stack
    )
    assert "i7" not in rows_of(world, "backfill")
    assert "no users row with user_id = 9" in dead_reasons(spark, world, "backfill")
    assert (report.events_dead, report.training_rows, report.dimension_misses) == (
        4,
        4,
        {"users": 1},
    )
    assert report.reconciled

    # A shuffle_key keeps the stage on the stream writer (spark_jobs.live.inplan.unsupported):
    # the one live test of that path on the real stack, and of the line that says so.
    shuffled = replace(pipeline, output=HandoffOutput(shuffle_key="id"))
    said: list[str] = []
    run = LiveRun(spark, world, shuffled, progress=said.append)
    try:
        world.send(
            "impressions",
            [
                {"id": "e1", "user_id": 1, "ts": m(0), "position": 1, "device": "ios"},
                {"id": "e2", "user_id": 42, "ts": m(1), "position": 2, "device": "web"},
            ],
        )
        # A click on the event that cannot train: its positive must not train or count again.
        world.send("clicks", [{"id": "e1", "ts": m(0.5)}, {"id": "e2", "ts": m(1.5)}])
        wait_for(lambda: ("e1", 1.0) in {(r["id"], r["label"]) for r in rows_of_all(world)}, "e1")
        wait_for(
            lambda: "no users row with user_id = 42" in dead_reasons(spark, world, "live"), "e2"
        )
    finally:
        report = run.finish()
    assert sorted((r["id"], r["label"]) for r in rows_of_all(world)) == [("e1", 0.0), ("e1", 1.0)]
    assert dead_reasons(spark, world, "live") == ["no users row with user_id = 42"]
    assert (report.events_input, report.events_dead, report.dimension_misses) == (
        2,
        1,
        {"users": 1},
    )
    assert report.reconciled
    assert report.tags["flow.live.writer"] == "stream"
    assert "shuffle_key" in report.tags["flow.live.writer_reason"]
    chosen = [line for line in said if line.startswith("live: writer ")]
    assert chosen == [f"live: writer stream ({report.tags['flow.live.writer_reason']})"], said


DERIVED = (
    Derived("minute_of_day", "hour(ts) * 60 + minute(ts)", type="int"),
    Derived("mobile", "device IN ('ios', 'android')"),
    Derived("slot", "minute_of_day div 15", type="int"),  # from the one before
)


def with_derived(pipeline: Pipeline, derive: tuple[Derived, ...]) -> Pipeline:
    """``pipeline`` with ``derive`` on every stage, and the derived columns passed through."""
    names = tuple(d.name for d in derive)
    stages = tuple(
        replace(
            s,
            derive=derive,
            features=replace(s.features, passthrough=(*s.features.passthrough, *names)),
        )
        for s in pipeline.stages
    )
    return replace(pipeline, stages=stages)


def test_derived_columns_are_the_same_in_a_backfill_and_a_stream(
    spark: SparkSession, world: Lake
) -> None:
    pipeline = with_derived(world.pipeline("immediate", trigger="1 second"), DERIVED)
    run_backfill(spark, pipeline, pipeline.stage("backfill", BackfillStage), world.stack)

    def derived(row: dict[str, Any]) -> tuple[Any, ...]:
        return row["minute_of_day"], row["mobile"], row["slot"]

    def minute_of_day(t: datetime) -> int:  # T0 is the clock's: i2 may fall past midnight
        return t.hour * 60 + t.minute

    batch = {k: derived(r) for k, r in rows_of(world, "backfill").items()}
    first, second = minute_of_day(m(0)), minute_of_day(m(1))
    assert batch["i1"] == (first, 1.0, first // 15)
    assert batch["i2"] == (second, 0.0, second // 15)  # web
    assert batch["i4"][1] is None  # no device: null, as SQL says
    run = LiveRun(spark, world, pipeline)
    try:
        world.send(  # the same events as i1, i2 and i4 of the history
            "impressions",
            [
                {"id": "e1", "user_id": 1, "ts": m(0), "position": 1, "device": "ios"},
                {"id": "e2", "user_id": 2, "ts": m(1), "position": 2, "device": "web"},
                {"id": "e4", "user_id": 3, "ts": m(3), "position": 4},
            ],
        )
        wait_for(lambda: len(rows_of_all(world)) == 3, "the three events")
    finally:
        run.finish()
    stream = {r["id"]: derived(r) for r in rows_of_all(world)}
    assert stream == {"e1": batch["i1"], "e2": batch["i2"], "e4": batch["i4"]}


def test_a_derived_expression_that_does_not_resolve_stops_the_stage_before_it_reads(
    spark: SparkSession, world: Lake
) -> None:
    pipeline = with_derived(world.pipeline(), (Derived("hour", "hour(tss)", type="int"),))
    stage = pipeline.stage("backfill", BackfillStage)
    with pytest.raises(ConfigError, match=r"Derived\('hour', 'hour\(tss\)'\) does not work.*tss"):
        run_backfill(spark, pipeline, stage, world.stack)
    assert not Channel(f"{world.stack.handoff}/{world.ns}", "backfill").exists()


@pytest.mark.parametrize(
    ("weight", "unusable", "reason"),
    [
        # A weight the events carry: checked as the rows leave the label join.
        ("position", "e4", "weight 'position' = null is not a positive number"),
        # A weight from a dimension table: checked once the rows are enriched.
        ("user_boost", "e3", "weight 'user_boost' = 0.0 is not a positive number"),
    ],
)
def test_rows_that_cannot_train_are_dead_letters_with_their_reason(
    spark: SparkSession, world: Lake, weight: str, unusable: str, reason: str
) -> None:
    pipeline = world.pipeline("immediate", weight=weight, trigger="1 second")
    run_backfill(spark, pipeline, pipeline.stage("backfill", BackfillStage), world.stack)
    run = LiveRun(spark, world, pipeline)
    try:
        world.send(
            "impressions",
            [
                {"id": "e1", "user_id": 1, "ts": m(0), "position": 1, "device": "ios"},
                {"id": "e3", "user_id": 3, "ts": m(1), "position": 2, "device": "web"},
                {"id": "e4", "user_id": 2, "ts": m(2), "device": "web"},  # no position
            ],
        )
        world.send("clicks", [{"id": "e1", "ts": m(0.5)}])
        wait_for(lambda: reason in dead_reasons(spark, world, "live"), "the unusable row")
        wait_for(lambda: ("e1", 1.0) in {(r["id"], r["label"]) for r in rows_of_all(world)}, "e1")
    finally:
        report = run.finish()

    trained = sorted((r["id"], r["label"]) for r in rows_of_all(world))
    usable = ({"e3", "e4"} - {unusable}).pop()
    assert trained == sorted([("e1", 0.0), ("e1", 1.0), (usable, 0.0)])
    assert dead_reasons(spark, world, "live") == [reason]
    assert (report.events_input, report.events_dead, report.training_rows) == (3, 1, 3)
    assert report.reconciled
