"""The Kafka parse gives the same rows and dead letters whether Spark compiles it into one
generated method (``hugeMethodLimit`` 65535, Spark's default) or, as the stack has it (8000),
falls back for the methods HotSpot would leave interpreted."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession

from flow.pipeline import Field, KafkaSource
from spark_jobs.jvm import codegen_text
from spark_jobs.validate import parse_kafka

pytestmark = pytest.mark.integration

LIMIT = "spark.sql.codegen.hugeMethodLimit"
FIELDS = (  # the CTR impressions, with an epoch time and an array: every kind of check
    Field("impression_id", "string", required=True),
    Field("user_id", "long", required=True, min=0),
    Field("item_id", "long", required=True, min=0),
    Field("ts", "timestamp", required=True, epoch="ms"),
    Field("position", "int", min=1, max=50),
    Field("device", "string", allowed=("ios", "android", "web")),
    Field("p_click", "double", min=0, max=1),
    Field("tags", "array<string>"),
)
SOURCE = KafkaSource("t", FIELDS, "ts", max_payload_bytes=2048)
DAY_MS = 86_400_000

GOOD = st.fixed_dictionaries(
    {
        "impression_id": st.text(min_size=1, max_size=12),
        "user_id": st.integers(0, 2**40),
        "item_id": st.integers(0, 2**40),
        "ts": st.integers(-DAY_MS, 60_000),  # from now; max_future is 10 minutes
        "position": st.integers(1, 50),
        "device": st.sampled_from(["ios", "android", "web"]),
        "p_click": st.floats(0, 1),
        "tags": st.lists(st.text(max_size=5), max_size=3),
    }
)
#: What a record may have wrong, each on top of a good one (None: nothing).
FAULTS = (
    None,
    "iso time",  # not a fault: ISO-8601 text reads too
    "missing id",
    "negative user",
    "position as text",
    "position too high",
    "unknown device",
    "p_click above 1",
    "time overflows",
    "time as words",
    "time in the future",
    "time too old",
    "tags not a list",
    "repeated key",
    "oversized",
    "not json",
    "not an object",
    "not utf-8",
    "null value",
)


def _value(record: dict[str, Any], fault: str | None, now_ms: int) -> bytes | None:
    """The Kafka value of ``record`` (times relative to ``now_ms``) with ``fault``."""
    out = {**record, "ts": now_ms + record["ts"]}
    if fault == "iso time":
        out["ts"] = datetime.fromtimestamp(out["ts"] / 1000, UTC).isoformat()
    changes: dict[str, object] = {
        "negative user": {"user_id": -5},
        "position as text": {"position": "first"},
        "position too high": {"position": 51},
        "unknown device": {"device": "tv"},
        "p_click above 1": {"p_click": 1.5},
        "time overflows": {"ts": 9_300_000_000_000_000},
        "time as words": {"ts": "yesterday"},
        "time in the future": {"ts": now_ms + DAY_MS},
        "time too old": {"ts": now_ms - 60 * DAY_MS},
        "tags not a list": {"tags": "a,b"},
        "oversized": {"padding": "x" * 4096},
    }
    if isinstance(change := changes.get(fault or ""), dict):
        out.update(change)
    if fault == "missing id":
        del out["impression_id"]
    text = json.dumps(out)
    if fault == "repeated key":
        text = text.replace("{", '{"device": "tv", ', 1)
    special: dict[str, bytes | None] = {
        "not json": text[:-1].encode(),
        "not an object": f"[{text}]".encode(),
        "not utf-8": b"\xff" + text.encode(),
        "null value": None,
    }
    return special[fault] if fault in special else text.encode()


def _records(spark: SparkSession, values: list[bytes | None]) -> DataFrame:
    produced = datetime(2026, 2, 1, tzinfo=UTC)
    rows = [(None, v, "t", 0, i, produced) for i, v in enumerate(values)]
    layout = (
        "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"
    )
    return spark.createDataFrame(rows, layout)


def _parsed(spark: SparkSession, records: DataFrame, limit: str) -> list[tuple[Any, ...]]:
    spark.conf.set(LIMIT, limit)
    rows = parse_kafka(records, SOURCE, "events").orderBy("offset").collect()
    # The processing time in a reason is the query's clock, read anew by each query.
    return [(*r[:-1], re.sub(r"processing time [\d :-]+", "T", r[-1])) for r in rows]


def _largest_method(spark: SparkSession, df: DataFrame) -> int:
    """Bytes of bytecode in the plan's largest generated method (Spark's codegen explain)."""
    text = codegen_text(df)
    return max(int(n) for n in re.findall(r"maxMethodCodeSize:(\d+)", text))


def test_the_parse_makes_a_method_hotspot_will_not_compile(spark: SparkSession) -> None:
    """Else the comparison below compares one plan with itself (and the stack's limit is moot)."""
    records = _records(spark, [b'{"impression_id": "a"}'])
    assert _largest_method(spark, parse_kafka(records, SOURCE, "events")) > 8000


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(GOOD, st.sampled_from(FAULTS)), min_size=1, max_size=40))
def test_the_parse_is_the_same_with_and_without_whole_stage_codegen(
    spark: SparkSession, batch: list[tuple[dict[str, Any], str | None]]
) -> None:
    now_ms = int(time.time() * 1000)
    records = _records(spark, [_value(record, fault, now_ms) for record, fault in batch])
    before = spark.conf.get(LIMIT) or "65535"
    try:
        compiled = _parsed(spark, records, "65535")
        fallen_back = _parsed(spark, records, "8000")
    finally:
        spark.conf.set(LIMIT, before)
    assert fallen_back == compiled
    reasons = [r[-1] for r in compiled]
    for (_, fault), reason in zip(batch, reasons, strict=True):
        assert (reason == "") == (fault in (None, "iso time")), (fault, reason)
