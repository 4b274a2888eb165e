"""One Spark session for the whole test session (a driver JVM takes seconds to start), and a
small lake with a label join and an enrichment that several modules' backfills read."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from flow.config import StackConfig
from spark_jobs.live.plan import STATE_STORES, use_state_store
from spark_jobs.session import get_session
from tests.spark_jobs.test_stages import TS, Lake, m

WATERMARKS = "spark.sql.streaming.multipleWatermarkPolicy"
ZONE = "spark.sql.session.timeZone"


@pytest.fixture(scope="session")
def spark(running_stack: StackConfig) -> Iterator[SparkSession]:
    session = get_session(running_stack, app_name="primus-flow-tests")
    yield session
    session.stop()


@pytest.fixture
def rocksdb(spark: SparkSession) -> Iterator[SparkSession]:
    """The session with the stage's default store (transformWithState runs on RocksDB only),
    and the settings it had before given back after the test."""
    keys = [*STATE_STORES["rocksdb"], WATERMARKS, ZONE]  # (as the stage starts with them)
    before = {key: spark.conf.get(key, None) for key in keys}
    use_state_store(spark, "rocksdb")
    spark.conf.set(WATERMARKS, "min")
    spark.conf.set(ZONE, "UTC")
    yield spark
    for key, value in before.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)


@pytest.fixture
def lake(running_stack: StackConfig) -> Lake:
    """60 impressions of users 1-4 and 9 (unknown: its columns enrich to nulls), a third
    clicked, positions 1-50 and null, devices with nulls."""
    pick = random.Random(3)
    world = Lake(running_stack, f"c{uuid.uuid4().hex[:8]}")
    impressions = [
        {
            "id": f"i{n}",
            "user_id": pick.choice([1, 2, 3, 4, 9]),
            "ts": m(n),
            "position": pick.choice([None, 1, 2, 7, 12, 30, 50]),
            "device": pick.choice([None, "ios", "android", "web"]),
        }
        for n in range(60)
    ]
    world.table(
        "impressions_history",
        impressions,
        pa.schema(
            [
                ("id", pa.string()),
                ("user_id", pa.int64()),
                ("ts", TS),
                ("position", pa.int32()),
                ("device", pa.string()),
            ]
        ),
    )
    clicks = [{"id": f"i{n}", "ts": m(n + 1)} for n in range(0, 60, 3)]
    world.table("clicks_history", clicks, pa.schema([("id", pa.string()), ("ts", TS)]))
    world.users()
    return world
