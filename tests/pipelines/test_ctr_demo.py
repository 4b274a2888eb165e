"""The demo pipeline is the CTR backfill and streaming pipelines composed, with nothing changed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from flow.pipeline import BackfillStage, LiveStage, Pipeline
from pipelines.ctr_backfill import ctr_backfill
from pipelines.ctr_demo import ctr_demo
from pipelines.ctr_streaming import ctr_streaming


def merged_by_hand(namespace: str, max_records_per_batch: int) -> Pipeline:
    """ctr_demo as it was written before pipelines composed: sources and stages copied (its
    live stage emits impressions at once)."""
    history = ctr_backfill(namespace)
    live = ctr_streaming(
        namespace, max_records_per_batch=max_records_per_batch, label_strategy="immediate"
    )
    backfill = history.stage("backfill")
    streaming = live.stage("live")
    assert isinstance(backfill, BackfillStage)
    assert isinstance(streaming, LiveStage)
    assert backfill.label is not None
    return Pipeline(
        name="ctr_demo",
        namespace=namespace,
        sources={
            "history": history.sources["impressions"],
            "history_clicks": history.sources["clicks"],
            **live.sources,
        },
        stages=(
            replace(
                backfill,
                events="history",
                label=replace(backfill.label, source="history_clicks"),
            ),
            replace(streaming, trigger="2 seconds"),
        ),
    )


@pytest.mark.parametrize(("namespace", "per_batch"), [("ctr", 5_000), ("demo2", 300)])
def test_the_composed_demo_equals_the_hand_merged_one(namespace: str, per_batch: int) -> None:
    composed = ctr_demo(namespace, per_batch)
    by_hand = merged_by_hand(namespace, per_batch)
    assert composed == by_hand
    assert composed.columns == by_hand.columns
    assert list(composed.sources) == [
        "history",
        "history_clicks",
        "users",
        "items",
        "impressions",
        "clicks",
    ]
