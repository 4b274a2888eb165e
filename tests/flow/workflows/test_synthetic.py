"""The synthetic CTR world: reproducible, skewed, learnable, and broken where it should be."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow.compute as pc
import pytest

from flow.errors import ConfigError
from flow.workflows.streaming import StreamPlan, encode_stream
from flow.workflows.synthetic import (
    AGE_MEAN,
    AGE_PRICE,
    AGE_SD,
    CATEGORIES,
    DEVICE_CATEGORY,
    DEVICES,
    LOG_PRICE_MEAN,
    LOG_PRICE_SD,
    ClickModel,
    Events,
    SyntheticWorld,
    simulate,
)
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


def _small_events(world: SyntheticWorld, count: int = 6) -> Events:
    return simulate(
        world.users_table(),
        world.items_table(),
        count=count,
        start=START,
        span=timedelta(hours=6),
        seed=5,
        world=world,
    )


def test_a_world_without_interactions_is_the_world_as_it_was() -> None:
    # p_click as this world gave it before `interactions` existed (recorded then): histories
    # written earlier, and the figures measured on them, stay valid.
    w = SyntheticWorld(seed=3, users=50, items=30, anchor=START - timedelta(days=1))
    recorded = [
        0.005679077732343384,
        0.06958241340641856,
        0.012096448866566113,
        0.020430392885761955,
        0.17971442208429309,
        0.0008983537405923292,
    ]
    p = _small_events(w).impressions.column("p_click").to_numpy()
    # Not bit for bit across machines: numpy picks its exp and log kernels by the CPU's vector
    # instructions, and they differ in the last bits (2e-11 relative on a CPU without AVX-512
    # against the one these were recorded on). A changed world differs in the leading digits.
    np.testing.assert_allclose(p, recorded, rtol=1e-9)
    # The option draws from a random stream of its own: the rest of the world is unchanged.
    with_them = replace(w, interactions=1.0)
    assert with_them.users_table() == w.users_table()
    assert with_them.items_table() == w.items_table()
    shown = _small_events(w).impressions.drop(["p_click"])
    assert _small_events(with_them).impressions.drop(["p_click"]) == shown


def _logit(p: np.ndarray) -> np.ndarray:
    logit: np.ndarray = np.log(p / (1 - p))
    return logit


def test_interactions_add_a_device_by_category_effect_with_no_main_effects() -> None:
    plain = SyntheticWorld(seed=3, users=50, items=200, drift=0, new_items=0)
    users, items = plain.users_table(), plain.items_table()
    scale = 2.0
    model = ClickModel(users, items, replace(plain, interactions=scale))
    before = ClickModel(users, items, plain)
    table = model.device_category[: len(DEVICES), : len(CATEGORIES)]
    assert table.std() == pytest.approx(DEVICE_CATEGORY * scale)
    np.testing.assert_allclose(table.mean(axis=0), 0, atol=1e-12)  # no per-category part
    np.testing.assert_allclose(table.mean(axis=1), 0, atol=1e-12)  # no per-device part
    # One user and item on every device: the logits move by the table's entries, exactly.
    category = CATEGORIES.index(items.column("category")[0].as_py())
    age = users.column("age")[0].as_py()
    price = items.column("price")[0].as_py()
    product = (age - AGE_MEAN) / AGE_SD * (np.log(price) - LOG_PRICE_MEAN) / LOG_PRICE_SD
    devices = [*DEVICES, None]
    args = (np.zeros(4), np.zeros(4), np.ones(4), devices, np.zeros(4))
    shift = _logit(model.probability(*args)) - _logit(before.probability(*args))
    expected = [*table[:, category], 0.0] + AGE_PRICE * scale * product
    np.testing.assert_allclose(shift, expected, atol=1e-9)
    assert shift[0] - shift[1] == pytest.approx(table[0, category] - table[1, category])


def test_interactions_favour_dear_items_for_older_users() -> None:
    w = SyntheticWorld(seed=3, users=300, items=300, drift=0, new_items=0, interactions=1.0)
    users, items = w.users_table(), w.items_table()
    model = ClickModel(users, items, w)
    plain = ClickModel(users, items, replace(w, interactions=0.0))
    ages = np.array(users.column("age").to_pylist(), dtype=float)
    prices = np.array(items.column("price").to_pylist(), dtype=float)
    old, young = int(np.nanargmax(ages)), int(np.nanargmin(ages))
    dear, cheap = int(np.nanargmax(prices)), int(np.nanargmin(prices))
    pairs = [(old, dear), (old, cheap), (young, dear), (young, cheap)]
    u = np.array([p[0] for p in pairs])
    i = np.array([p[1] for p in pairs])
    # No device: the device x category table adds nothing, the shift is age x price alone.
    args = (u, i, np.ones(4), [None] * 4, np.zeros(4))
    shift = _logit(model.probability(*args)) - _logit(plain.probability(*args))
    z_age = (ages[u] - AGE_MEAN) / AGE_SD
    z_price = (np.log(prices[i]) - LOG_PRICE_MEAN) / LOG_PRICE_SD
    np.testing.assert_allclose(shift, AGE_PRICE * z_age * z_price, atol=1e-9)
    assert shift[0] > 0, "old with dear clicks more"
    assert shift[3] > 0, "young with cheap clicks more"
    assert shift[1] < 0
    assert shift[2] < 0
    # A missing age (or price) is the average one: no effect.
    missing = int(np.flatnonzero(np.isnan(ages))[0])
    at = (np.array([missing]), np.array([dear]), np.ones(1), [None], np.zeros(1))
    assert model.probability(*at) == pytest.approx(plain.probability(*at), rel=1e-12)


def test_a_world_with_interactions_is_reproducible_and_recorded() -> None:
    w = SyntheticWorld(seed=4, users=40, items=30, interactions=1.5, anchor=START)
    assert SyntheticWorld.from_property(w.to_property()) == w
    first = _small_events(w, count=200).impressions.column("p_click")
    assert first == _small_events(w, count=200).impressions.column("p_click")
    other = _small_events(replace(w, seed=5), count=200).impressions.column("p_click")
    assert first != other
    # A world recorded before the option existed reads back as one without interactions.
    fields = json.loads(w.to_property())
    del fields["interactions"]
    older = SyntheticWorld.from_property(json.dumps(fields))
    assert older == replace(w, interactions=0.0)
    with pytest.raises(ConfigError, match=r"interactions=-1"):
        SyntheticWorld(interactions=-1)
