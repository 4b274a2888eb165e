"""The synthetic CTR world: reproducible, skewed, learnable, and broken where it should be."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow.compute as pc
import pytest

from flow.errors import ConfigError
from flow.workflows.streaming import StreamPlan, encode_stream
from flow.workflows.synthetic import ClickModel, Events, SyntheticWorld, simulate
from tests.support import auc

START = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def world() -> tuple[SyntheticWorld, Events]:
    w = SyntheticWorld(seed=3, users=2000, items=400, anchor=START - timedelta(days=1))
    events = simulate(
        w.users_table(),
        w.items_table(),
        count=40_000,
        start=START,
        span=timedelta(hours=6),
        seed=5,
        world=w,
    )
    return w, events


def test_the_same_seed_gives_the_same_world() -> None:
    assert (
        SyntheticWorld(seed=1, users=50, items=20).users_table()
        == SyntheticWorld(seed=1, users=50, items=20).users_table()
    )
    assert (
        SyntheticWorld(seed=1, users=50, items=20).items_table()
        != SyntheticWorld(seed=2, users=50, items=20).items_table()
    )


def test_ids_are_skewed_values_go_missing_and_clicks_follow_impressions(
    world: tuple[SyntheticWorld, Events],
) -> None:
    w, events = world
    users = events.impressions.column("user_id").to_numpy()
    _, counts = np.unique(users, return_counts=True)
    assert counts.max() > 20 * np.median(counts), "Zipf: the most active user dwarfs the median one"
    assert w.users_table().column("age").null_count > 0
    assert events.impressions.column("device").null_count > 0
    shown = dict(
        zip(
            events.impressions.column("impression_id").to_pylist(),
            events.impressions.column("ts").to_pylist(),
            strict=True,
        )
    )
    for click in events.clicks.to_pylist():
        assert click["ts"] >= shown[click["impression_id"]]
    assert 0.03 < len(events.clicks) / len(events.impressions) < 0.2
    assert events.late_clicks > 0


def test_the_signal_is_learnable_and_p_click_is_the_truth(
    world: tuple[SyntheticWorld, Events],
) -> None:
    w, events = world
    model = ClickModel(w.users_table(), w.items_table(), w)
    imps = events.impressions
    clicked = set(events.clicks.column("impression_id").to_pylist())
    labels = np.array([i in clicked for i in imps.column("impression_id").to_pylist()])
    scores = model.probability(
        imps.column("user_id").to_numpy(),
        imps.column("item_id").to_numpy(),
        imps.column("position").to_numpy(),
        imps.column("device").to_pylist(),
        imps.column("ts").to_numpy(),
    )
    assert auc(scores, labels) > 0.65
    recorded = imps.column("p_click").to_numpy()
    np.testing.assert_allclose(recorded, scores, rtol=1e-9)  # ts stored to the microsecond
    assert imps.schema.field("p_click").type == "double"
    assert abs(labels.mean() - recorded.mean()) < 0.01, "clicks are drawn from p_click"


def test_the_world_round_trips_through_its_table_property() -> None:
    w = SyntheticWorld(seed=9, users=10, items=10, drift=0.3, anchor=START)
    assert SyntheticWorld.from_property(w.to_property()) == w
    with pytest.raises(ConfigError, match=r"SyntheticWorld\.anchor is not set"):
        ClickModel(w.users_table(), w.items_table(), SyntheticWorld(users=10, items=10))
    with pytest.raises(ConfigError, match="new_items=1"):
        SyntheticWorld(new_items=1)


def test_the_stream_is_in_event_time_order_and_broken_where_asked(
    world: tuple[SyntheticWorld, Events],
) -> None:
    _, events = world
    plan = StreamPlan()
    records = list(
        encode_stream(events, malformed_share=0.05, max_payload_bytes=1000, seed=1, plan=plan)
    )
    times = [t for _, _, _, t in records]
    assert times == sorted(times)
    assert set(plan.malformed) == {
        "not_json",
        "missing_field",
        "wrong_type",
        "out_of_range",
        "oversized",
    }
    assert plan.produced["impressions"] == len(events.impressions)
    broken = 0
    for kind, _key, payload, _ in records:
        if kind != "impressions":
            continue
        try:
            record = json.loads(payload)
        except ValueError:
            broken += 1
            continue
        if (
            "user_id" not in record
            or not isinstance(record["item_id"], int)
            or record["position"] < 1
            or len(payload) > 1000
        ):
            broken += 1
    assert broken == sum(plan.malformed.values())


def test_late_clicks_land_beyond_the_window(world: tuple[SyntheticWorld, Events]) -> None:
    _, events = world
    shown = dict(
        zip(
            events.impressions.column("impression_id").to_pylist(),
            events.impressions.column("ts").to_pylist(),
            strict=True,
        )
    )
    delays = np.array(
        [(c["ts"] - shown[c["impression_id"]]).total_seconds() for c in events.clicks.to_pylist()]
    )
    assert (delays > 30 * 60).sum() == events.late_clicks
    assert pc.min(events.clicks.column("ts")).as_py() >= START


def test_late_arrivals_come_out_of_order_but_within_their_hold(
    world: tuple[SyntheticWorld, Events],
) -> None:
    _, events = world
    plan = StreamPlan()
    hold = timedelta(minutes=3)
    records = list(
        encode_stream(events, late_arrival_share=0.05, late_arrival=hold, seed=2, plan=plan)
    )
    times = [t for _, _, _, t in records]
    assert plan.late_arrivals > 0
    assert times != sorted(times)
    newest = times[0]
    for t in times:
        assert t >= newest - hold, "a record was held back longer than late_arrival"
        newest = max(newest, t)
    assert len(records) == len(events.impressions) + len(events.clicks)
