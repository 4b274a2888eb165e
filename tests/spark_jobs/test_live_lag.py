"""A live stage that is behind says so: after each batch, the records its Kafka topics hold past
the batch's end offsets, and how old its newest event was; 0 records once it has caught up."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pyspark.sql import SparkSession

from flow.pipeline import KafkaSource, LiveStage, RunOptions
from spark_jobs.live import run_live
from tests.spark_jobs.test_stages import Lake, live_world, m, world  # noqa: F401 (fixtures)

pytestmark = pytest.mark.integration

IMPRESSIONS = 8
PER_BATCH = 2


def test_a_stage_reading_slower_than_its_topic_fills_reports_its_lag_per_batch(
    spark: SparkSession,
    live_world: Lake,  # noqa: F811 (the fixture)
) -> None:
    """Eight impressions wait in the topic; the stage reads two a batch (maxOffsetsPerTrigger),
    so each batch but the last leaves records behind, and says how many."""
    base = live_world.pipeline()
    events = base.sources["impressions"]
    assert isinstance(events, KafkaSource)
    pipeline = replace(
        base,
        sources={**base.sources, "impressions": replace(events, max_records_per_batch=PER_BATCH)},
    )
    live_world.send(
        "impressions",
        [
            {"id": f"e{i}", "user_id": 1, "ts": m(i), "position": 1, "device": "ios"}
            for i in range(IMPRESSIONS)
        ],
    )
    batches: list[dict[str, float]] = []
    said: list[str] = []
    run_live(
        spark,
        pipeline,
        pipeline.stage("live", LiveStage),
        live_world.stack,
        RunOptions(),
        progress=said.append,
        on_batch=lambda metrics, _batch: batches.append(metrics),
    )
    read = [b for b in batches if b["batch_rows_in"] > 0]
    assert sum(b["batch_rows_in"] for b in read) == IMPRESSIONS
    lags = [b["kafka_lag"] for b in batches]
    assert lags[0] >= IMPRESSIONS - PER_BATCH, lags  # behind: what the first batch left
    assert lags == sorted(lags, reverse=True), lags  # catching up
    assert lags[-1] == 0, lags  # caught up
    # Its events are from three hours ago: the newest of every batch that read some is old.
    assert all(b["event_time_delay_s"] > 3600 for b in read), read
    assert any("records behind Kafka's latest" in line for line in said), said
