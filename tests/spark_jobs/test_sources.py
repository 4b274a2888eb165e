"""Table sources read the snapshot, time, increment or event-time range they ask for."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Literal

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.pipeline import DeltaSource, Field, IcebergSource, KafkaSource
from flow.stack.iceberg import open_catalog
from spark_jobs.jvm import status_tracker
from spark_jobs.sources import read_table
from spark_jobs.validate import REASON, parse_kafka

pytestmark = pytest.mark.integration

T0 = datetime(2026, 2, 1, tzinfo=UTC)
FIELDS = (Field("id", "long", required=True), Field("ts", "timestamp"))
SCHEMA = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))])


def batch(ids: range) -> pa.Table:
    return pa.table({"id": list(ids), "ts": [T0 + timedelta(hours=i) for i in ids]}, schema=SCHEMA)


def ids(spark: SparkSession, stack: StackConfig, source: IcebergSource | DeltaSource) -> list[int]:
    return sorted(r.id for r in read_table(spark, stack, source).df.collect())


def test_iceberg_snapshots_time_travel_increments_and_ranges(
    spark: SparkSession, running_stack: StackConfig
) -> None:
    catalog = open_catalog(running_stack.catalog)
    catalog.create_namespace_if_not_exists("reads")
    name = f"reads.t{uuid.uuid4().hex[:8]}"
    table = catalog.create_table(name, schema=SCHEMA)
    assert read_table(spark, running_stack, IcebergSource(name, FIELDS)).snapshot_id is None
    table.append(batch(range(3)))
    first = table.current_snapshot()
    assert first is not None
    time.sleep(0.05)
    between = datetime.now(UTC)
    time.sleep(0.05)
    table.append(batch(range(3, 5)))
    table.append(batch(range(5, 6)))
    latest = table.current_snapshot()
    assert latest is not None

    everything = IcebergSource(name, FIELDS)
    assert ids(spark, running_stack, everything) == list(range(6))
    jobs = set(status_tracker(spark).getJobIdsForGroup(None))
    read = read_table(spark, running_stack, everything)
    assert read.snapshot_id == latest.snapshot_id
    # The current snapshot comes from a table property, without a Spark job (each job costs a
    # cluster ~0.3 s: spark_jobs/README.md); reading the frame runs them, planning it does not.
    assert set(status_tracker(spark).getJobIdsForGroup(None)) == jobs
    assert ids(
        spark, running_stack, IcebergSource(name, FIELDS, snapshot_id=first.snapshot_id)
    ) == [0, 1, 2]
    travelled = IcebergSource(name, FIELDS, as_of=between)
    assert ids(spark, running_stack, travelled) == [0, 1, 2]
    assert read_table(spark, running_stack, travelled).snapshot_id == first.snapshot_id
    since = IcebergSource(name, FIELDS, since_snapshot=first.snapshot_id)
    assert ids(spark, running_stack, since) == [3, 4, 5]
    window = IcebergSource(
        name, FIELDS, event_time="ts", start=T0 + timedelta(hours=1), end=T0 + timedelta(hours=4)
    )
    assert ids(spark, running_stack, window) == [1, 2, 3]


def test_declared_columns_are_checked_against_the_table(
    spark: SparkSession, running_stack: StackConfig
) -> None:
    catalog = open_catalog(running_stack.catalog)
    catalog.create_namespace_if_not_exists("reads")
    name = f"reads.t{uuid.uuid4().hex[:8]}"
    catalog.create_table(name, schema=SCHEMA).append(batch(range(2)))
    with pytest.raises(ConfigError, match=r"has no column\(s\) price; its columns: id, ts"):
        read_table(spark, running_stack, IcebergSource(name, (*FIELDS, Field("price", "double"))))
    with pytest.raises(
        ConfigError, match=r"column 'id' is bigint, declared int; declare Field\('id', 'long'\)"
    ):
        read_table(spark, running_stack, IcebergSource(name, (Field("id", "int"),)))
    with pytest.raises(ConfigError, match=r"column 'id' is bigint, declared string"):
        read_table(spark, running_stack, IcebergSource(name, (Field("id", "string"),)))
    with pytest.raises(ConfigError, match="does not exist in catalog"):
        read_table(spark, running_stack, IcebergSource("reads.nope", FIELDS))


def test_delta_tables_read_by_version(spark: SparkSession, running_stack: StackConfig) -> None:
    path = f"reads_{uuid.uuid4().hex[:8]}"
    full = str(running_stack.lake / path)
    spark.createDataFrame(batch(range(2)).to_pandas()).write.format("delta").save(full)
    spark.createDataFrame(batch(range(2, 4)).to_pandas()).write.format("delta").mode("append").save(
        full
    )
    assert ids(spark, running_stack, DeltaSource(path, FIELDS)) == [0, 1, 2, 3]
    assert ids(spark, running_stack, DeltaSource(path, FIELDS, version=0)) == [0, 1]
    assert read_table(spark, running_stack, DeltaSource(path, FIELDS)).version == 1


def _kafka_records(spark: SparkSession, values: list[str]) -> DataFrame:
    """Records as the Kafka source hands them over, with these JSON values."""
    rows = [(None, v.encode(), "t", 0, i, datetime.now(UTC)) for i, v in enumerate(values)]
    layout = (
        "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"
    )
    return spark.createDataFrame(rows, layout)


def test_kafka_times_given_as_epoch_numbers_in_the_declared_unit(spark: SparkSession) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    seconds = int(now.timestamp())
    values = [
        json.dumps({"id": 1, "ts": seconds}),
        json.dumps({"id": 2, "ts": str(seconds)}),
        json.dumps({"id": 3, "ts": seconds + 0.5}),
        json.dumps({"id": 4, "ts": now.isoformat()}),  # ISO-8601 still reads
        json.dumps({"id": 5, "ts": seconds * 1000}),  # milliseconds, read as seconds
        json.dumps({"id": 6, "ts": "yesterday"}),
    ]
    fields = (Field("id", "long", required=True), Field("ts", "timestamp", epoch="s"))
    parsed = parse_kafka(_kafka_records(spark, values), KafkaSource("t", fields, "ts"), "events")
    found = {r["id"]: (r["ts"], r[REASON]) for r in parsed.collect()}
    half = timedelta(seconds=0.5)
    at = now.replace(tzinfo=None)  # Spark hands back naive times in its session zone, UTC
    assert [found[i] for i in (1, 2, 3, 4)] == [(at, ""), (at, ""), (at + half, ""), (at, "")]
    # Milliseconds read as seconds: year 58059, past Spark's (and Python's) timestamps.
    assert found[5] == (
        None,
        f"field 'ts' has value '{seconds * 1000}', which is out of range for a timestamp in "
        "epoch s (years 1-9999)",
    )
    assert found[6][1] == "field 'ts' has value 'yesterday', which is not a timestamp"

    millis = (Field("id", "long"), Field("ts", "timestamp", epoch="ms"))
    values = [json.dumps({"id": 1, "ts": seconds * 1000 + 250})]
    parsed = parse_kafka(_kafka_records(spark, values), KafkaSource("t", millis, "ts"), "events")
    assert [(r["ts"], r[REASON]) for r in parsed.collect()] == [
        (at + timedelta(milliseconds=250), "")
    ]
    plain = (Field("id", "long"), Field("ts", "timestamp"))
    values = [json.dumps({"id": 1, "ts": seconds})]
    parsed = parse_kafka(_kafka_records(spark, values), KafkaSource("t", plain, "ts"), "events")
    assert (
        parsed.collect()[0][REASON] == f"field 'ts' has value '{seconds}', which is not a timestamp"
    )


def test_epoch_numbers_past_the_timestamp_range_are_dead_letters(spark: SparkSession) -> None:
    """Converted, 9.3e15 ms overflows a long, which (ANSI) failed the query at every replay."""
    now = datetime.now(UTC).replace(microsecond=0)
    millis = int(now.timestamp()) * 1000
    values = [
        json.dumps({"id": 1, "ts": millis}),
        json.dumps({"id": 2, "ts": 253_402_300_799_999}),  # the last millisecond of 9999
        json.dumps({"id": 3, "ts": -62_135_596_800_000}),  # the first of year 1
        json.dumps({"id": 4, "ts": 9_300_000_000_000_000}),
        json.dumps({"id": 5, "ts": -9_300_000_000_000_000}),
        json.dumps({"id": 6, "ts": 2**63 - 1}),
        json.dumps({"id": 7, "ts": 1e20}),  # past a long: read as a double
        json.dumps({"id": 8, "ts": 253_402_300_800_000}),  # year 10000
    ]
    fields = (Field("id", "long"), Field("ts", "timestamp", epoch="ms"))
    source = KafkaSource("t", fields, "ts", max_future=None, max_past=None)
    parsed = parse_kafka(_kafka_records(spark, values), source, "events")
    # As text: Python's datetime.fromtimestamp, which collect() uses, fails on year 1 itself.
    parsed = parsed.withColumn("ts", F.col("ts").cast("string"))
    found = {r["id"]: (r["ts"], r[REASON]) for r in parsed.collect()}
    assert [found[i] for i in (1, 2, 3)] == [
        (f"{now:%Y-%m-%d %H:%M:%S}", ""),
        ("9999-12-31 23:59:59.999", ""),
        ("0001-01-01 00:00:00", ""),
    ]
    assert found[4] == (
        None,
        "field 'ts' has value '9300000000000000', which is out of range for a timestamp in "
        "epoch ms (years 1-9999)",
    )
    for i in (5, 6, 7, 8):
        assert found[i][0] is None
        assert "which is out of range for a timestamp in epoch ms" in found[i][1], found[i]

    # Seconds saturated to year 294247 without a word; microseconds past 9999 held no error.
    cases: tuple[tuple[Literal["s", "us"], int], ...] = (("s", 10**13), ("us", 2**63 - 1))
    for unit, value in cases:
        fields = (Field("id", "long"), Field("ts", "timestamp", epoch=unit))
        source = KafkaSource("t", fields, "ts", max_future=None, max_past=None)
        values = [json.dumps({"id": 1, "ts": value})]
        ((ts, reason),) = (
            parse_kafka(_kafka_records(spark, values), source, "events")
            .select("ts", REASON)
            .collect()
        )
        assert ts is None
        assert reason == (
            f"field 'ts' has value '{value}', which is out of range for a timestamp in epoch "
            f"{unit} (years 1-9999)"
        )
