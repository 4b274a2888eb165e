"""What History columns hold, on Spark: against a plain Python reading of the definition, and the
same whether a stage reads the whole table or only its part after a moment with the rows before
it as context (a holdout, an incremental read)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from flow.pipeline import History
from spark_jobs.history import with_history

pytestmark = pytest.mark.integration

START = datetime(2026, 1, 1, tzinfo=UTC)
HISTORIES = (
    History("seen", key="user"),
    History("liked", key="user", stat="mean", value="label"),
    History("recent", key="user", stat="sum", value="label", within=timedelta(seconds=3)),
)
SCHEMA = "id long, user long, ts timestamp, label int"

Event = tuple[int, int | None, datetime, int]

events = st.lists(
    st.tuples(
        st.sampled_from([1, 2, 3, None]),
        st.integers(0, 8),  # seconds: ties are common
        st.sampled_from([0, 1]),
    ),
    max_size=40,
).map(lambda rows: [(i, u, START + timedelta(seconds=s), y) for i, (u, s, y) in enumerate(rows)])


def _expected(rows: list[Event], row: Event) -> tuple[int | None, float | None, float | None]:
    """The definition read plainly: the same key, strictly earlier, within the bound."""
    _, user, ts, _ = row
    if user is None:
        return (None, None, None)
    earlier = [r for r in rows if r[1] == user and r[2] < ts]
    recent = [r[3] for r in earlier if ts - r[2] <= timedelta(seconds=3)]
    liked = sum(r[3] for r in earlier) / len(earlier) if earlier else None
    return (len(earlier), liked, float(sum(recent)))


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=events, cut=st.integers(0, 9))
def test_history_is_each_keys_strictly_earlier_events_with_or_without_context(
    spark: SparkSession, rows: list[Event], cut: int
) -> None:
    whole = with_history(spark.createDataFrame(rows, SCHEMA), HISTORIES, "ts")
    at = START + timedelta(seconds=cut)
    after = spark.createDataFrame([r for r in rows if r[2] >= at], SCHEMA)
    before = spark.createDataFrame([r for r in rows if r[2] < at], SCHEMA)
    part = with_history(after, HISTORIES, "ts", context=before)
    got = {r["id"]: (r["seen"], r["liked"], r["recent"]) for r in whole.collect()}
    assert got == {r[0]: _expected(rows, r) for r in rows}
    assert sorted(part.columns) == sorted(whole.columns)  # the context's marker is gone
    assert {r["id"]: (r["seen"], r["liked"], r["recent"]) for r in part.collect()} == {
        r[0]: got[r[0]] for r in rows if r[2] >= at
    }
