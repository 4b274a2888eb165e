"""A live batch's late records, as the SQL text its writers build once a batch
(spark_jobs.live.records): which records are late, and the reason a dead letter of one says."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import DataFrame, SparkSession

from spark_jobs.live.records import RECORD, late_reason_sql, late_sql, sql_name, sql_string

pytestmark = pytest.mark.integration

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
THRESHOLD_MS = int(T0.timestamp() * 1000)
WATERMARKS = {"impressions": "10 minutes", "clicks": "it's 5 minutes"}


def _records(spark: SparkSession, rows: list[tuple[str, str, datetime | None]]) -> DataFrame:
    """Records of (source, reason, event time) as the writers see them: one struct each."""
    frame = spark.createDataFrame(rows, "source string, _reason string, event_time timestamp")
    return frame.selectExpr(f"struct(source, _reason, event_time) AS {sql_name(RECORD)}")


def test_a_record_is_late_when_valid_and_at_or_before_the_threshold(spark: SparkSession) -> None:
    at = T0.replace(tzinfo=None)
    rows = [
        ("impressions", "", at - timedelta(seconds=1)),  # late
        ("impressions", "", at),  # at the threshold: late
        ("impressions", "", at + timedelta(milliseconds=1)),  # after it: on time
        ("clicks", "malformed", at - timedelta(hours=1)),  # invalid, not late
        ("clicks", "", None),  # no event time: not judged
    ]
    found = _records(spark, rows).selectExpr(f"{late_sql(THRESHOLD_MS)} AS late").collect()
    assert [r["late"] for r in found] == [True, True, False, False, False]


def test_a_late_record_says_how_far_behind_which_watermark_it_was(spark: SparkSession) -> None:
    # 12.35 s behind: a double (12.3499...) rounds down, as the seconds always did; the same
    # figure as a decimal would round up.
    at = (T0 - timedelta(milliseconds=12_350)).replace(tzinfo=None)
    frame = _records(spark, [("clicks", "", at), ("elsewhere", "", at)])
    said = [
        r["reason"]
        for r in frame.selectExpr(
            f"{late_reason_sql(THRESHOLD_MS, WATERMARKS, RECORD)} AS reason"
        ).collect()
    ]
    assert said == [
        "late: event time 2026-03-01 11:59:47 is 12.3 s behind the watermark 2026-03-01 "
        "12:00:00 (the source's watermark delay is it's 5 minutes)",
        "late: event time 2026-03-01 11:59:47 is 12.3 s behind the watermark 2026-03-01 "
        "12:00:00 (the source's watermark delay is )",
    ]
    # Over the record's fields as columns of their own, the same text.
    flat = frame.select(f"{RECORD}.*").selectExpr(
        f"{late_reason_sql(THRESHOLD_MS, WATERMARKS)} AS reason"
    )
    assert [r["reason"] for r in flat.collect()] == said


@pytest.mark.parametrize("text", ["plain", "it's", "back\\slash", "both \\' of them", ""])
def test_any_text_is_a_string_literal(spark: SparkSession, text: str) -> None:
    assert spark.sql(f"SELECT {sql_string(text)} AS t").collect()[0]["t"] == text
