"""History columns as a pipeline declares them: checked when built, read by features, and
known to need Spark. What they compute is tested on Spark (tests/spark_jobs/test_history.py)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from flow.errors import ConfigError
from flow.pipeline import (
    BackfillStage,
    Bucketized,
    Derived,
    Feature,
    Field,
    History,
    IcebergSource,
    Numeric,
    Pipeline,
)
from pipelines.ctr_backfill import ctr_backfill
from spark_jobs.history import context_sources


def _with_history(*history: History, features: tuple[Feature, ...] = ()) -> Pipeline:
    pipeline = ctr_backfill()
    stage = pipeline.stage("backfill", BackfillStage)
    spec = dataclasses.replace(stage.features, features=(*stage.features.features, *features))
    changed = dataclasses.replace(stage, history=history, features=spec)
    return dataclasses.replace(pipeline, stages=(changed,))


def test_history_columns_feed_features_and_derived_columns_and_need_spark() -> None:
    built = _with_history(
        History("user_seen", key="user_id"),
        History("user_position", key="user_id", stat="mean", value="position"),
        features=(Bucketized("user_seen", buckets=4, log=True), Numeric("user_position")),
    )
    columns = built.columns["backfill"]
    assert columns["user_seen"] == Field("user_seen", "long")
    assert columns["user_position"] == Field("user_position", "double")
    assert built.spark_only == {"backfill": ("user_seen", "user_position")}
    stage = dataclasses.replace(
        built.stage("backfill", BackfillStage),
        derive=(Derived("often", "user_seen > 10", type="boolean"),),
    )
    assert dataclasses.replace(built, stages=(stage,)).columns["backfill"]["often"].type == (
        "boolean"
    )


@pytest.mark.parametrize(
    ("history", "error"),
    [
        (History("h", key="user"), r"key 'user' is not a column of the events .* user_id"),
        (History("h", key="user_id", stat="mean", value="label"), "not a joined label"),
        (History("h", key="user_id", stat="sum", value="device"), "a string; give a numeric"),
        (History("user_id", key="item_id"), "adds column 'user_id', which 'impressions'"),
    ],
)
def test_a_history_that_cannot_be_computed_is_refused_when_built(
    history: History, error: str
) -> None:
    with pytest.raises(ConfigError, match=error):
        _with_history(history)


def test_a_history_definition_is_checked_alone() -> None:
    with pytest.raises(ConfigError, match="needs a value column"):
        History("h", key="user_id", stat="mean")
    with pytest.raises(ConfigError, match="stat='max'"):
        History("h", key="user_id", stat="max", value="x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be positive"):
        History("h", key="user_id", within=timedelta(0))


def test_a_partial_read_brings_the_rows_before_it_as_context() -> None:
    at = datetime(2026, 1, 5, tzinfo=UTC)
    split = ctr_backfill().holdout("backfill", after=at, channel="test")
    before, after = split.sources["impressions"], split.sources["impressions_after"]
    assert isinstance(before, IcebergSource)
    assert isinstance(after, IcebergSource)
    assert context_sources(before) == []  # the whole table up to `at`: nothing before it
    (context,) = context_sources(after)
    assert (context.start, context.end) == (None, at)
    (pinned,) = context_sources(after, snapshot=42)  # the snapshot the stage's own read used
    assert isinstance(pinned, IcebergSource)
    assert (pinned.snapshot_id, pinned.start, pinned.end) == (42, None, at)
    increment = dataclasses.replace(before, since_snapshot=7, start=at, end=None)
    as_of, earlier = context_sources(increment, snapshot=42)
    assert isinstance(as_of, IcebergSource)
    assert isinstance(earlier, IcebergSource)
    assert (as_of.snapshot_id, as_of.since_snapshot, as_of.start) == (7, None, None)
    assert (earlier.since_snapshot, earlier.start, earlier.end) == (7, None, at)
    assert earlier.snapshot_id is None  # an increment reads up to now, not one snapshot
