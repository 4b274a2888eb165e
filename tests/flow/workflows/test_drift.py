"""The synthetic world drifts: a model frozen after the history falls behind on the hours after
it, one trained on as it goes does not, and the true probability beats both."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from flow.workflows.synthetic import (
    CATEGORIES,
    COUNTRIES,
    DEVICES,
    ClickModel,
    Events,
    SyntheticWorld,
    Traffic,
    simulate,
)
from tests.support import auc

START = datetime(2026, 1, 1, tzinfo=UTC)
HISTORY_HOURS = 12
LIVE_HOURS = 6
PER_HOUR = 6_000


def codes(values: pa.Array | pa.ChunkedArray, vocabulary: tuple[str, ...]) -> np.ndarray:
    """1 + the index in ``vocabulary``; 0 for a missing value."""
    found = pc.index_in(values, value_set=pa.array(vocabulary)).fill_null(-1)
    return np.asarray(found.to_numpy(), dtype=np.int64) + 1


@dataclass
class Rows:
    """Impressions as a logistic model's inputs: one index per categorical feature (offset into
    one weight vector), a dense block, the label (a click within the window) and the truth."""

    sparse: np.ndarray
    dense: np.ndarray
    labels: np.ndarray
    p_click: np.ndarray
    hour: np.ndarray
    width: int


def featurize(world: SyntheticWorld, events: Events) -> Rows:
    users, items = world.users_table(), world.items_table()
    imps = events.impressions
    user = imps.column("user_id").to_numpy()
    item = imps.column("item_id").to_numpy()
    favorite = codes(users.column("favorite_category"), CATEGORIES)[user]
    category = codes(items.column("category"), CATEGORIES)[item]
    columns = {  # name: (index, cardinality); ids "hashed" to themselves (no collisions here)
        "user_id": (user, world.users),
        "item_id": (item, world.items),
        "category": (category, len(CATEGORIES) + 1),
        "favorite": (favorite, len(CATEGORIES) + 1),
        "taste_match": ((favorite == category).astype(np.int64), 2),
        "device": (codes(imps.column("device"), DEVICES), len(DEVICES) + 1),
        "country": (codes(users.column("country"), COUNTRIES)[user], len(COUNTRIES) + 1),
    }
    offsets = np.cumsum([0, *[size for _, size in columns.values()]])
    sparse = np.stack([index for index, _ in columns.values()], axis=1) + offsets[:-1]
    dense = np.stack(
        [
            np.log(imps.column("position").to_numpy()),
            items.column("rating").to_numpy()[item] - 3.5,
        ],
        axis=1,
    )
    shown = imps.column("ts").to_numpy().astype("datetime64[us]").astype(np.int64)
    position = pc.index_in(events.clicks.column("impression_id"), imps.column("impression_id"))
    clicked_at = np.full(len(imps), np.iinfo(np.int64).max)
    clicked_at[position.to_numpy()] = (
        events.clicks.column("ts").to_numpy().astype("datetime64[us]").astype(np.int64)
    )
    labels = clicked_at - shown <= 30 * 60 * 1_000_000  # as the label join: within the window
    hour = (shown - int(START.timestamp() * 1e6)) // 3_600_000_000
    p_click = imps.column("p_click").to_numpy()
    return Rows(sparse, dense, labels, p_click, hour, int(offsets[-1]))


class Logistic:
    """Logistic regression, full-batch Adam, L2 towards a prior (warm start: the last weights)."""

    def __init__(self, rows: Rows) -> None:
        self.rows = rows
        self.weights = np.zeros(rows.width + rows.dense.shape[1] + 1)

    def scores(self, at: np.ndarray) -> np.ndarray:
        w, n = self.weights, self.rows.width
        logits: np.ndarray = (
            w[self.rows.sparse[at]].sum(axis=1) + self.rows.dense[at] @ w[n:-1] + w[-1]
        )
        return logits

    def fit(self, at: np.ndarray, *, l2: float, steps: int = 80, lr: float = 0.1) -> Logistic:
        prior, w = self.weights.copy(), self.weights.copy()
        first, second = np.zeros_like(w), np.zeros_like(w)
        sparse, dense = self.rows.sparse[at], self.rows.dense[at]
        y, n, width = self.rows.labels[at].astype(np.float64), len(at), self.rows.width
        for step in range(1, steps + 1):
            self.weights = w
            error = 1 / (1 + np.exp(-self.scores(at))) - y
            grad = l2 * (w - prior)
            grad[:width] += (
                np.bincount(sparse.ravel(), np.repeat(error, sparse.shape[1]), minlength=width) / n
            )
            grad[width:-1] += dense.T @ error / n
            grad[-1] += error.mean()
            first = 0.9 * first + 0.1 * grad
            second = 0.999 * second + 0.001 * grad**2
            w = w - lr * (first / (1 - 0.9**step)) / (np.sqrt(second / (1 - 0.999**step)) + 1e-8)
        self.weights = w
        return self


@pytest.fixture(scope="module")
def rows() -> Rows:
    world = SyntheticWorld(seed=3, users=2000, items=600, arrival_days=3, anchor=START)
    hours = HISTORY_HOURS + LIVE_HOURS
    events = simulate(
        world.users_table(),
        world.items_table(),
        count=hours * PER_HOUR,
        start=START,
        span=timedelta(hours=hours),
        seed=5,
        world=world,
    )
    return featurize(world, events)


def test_a_frozen_model_falls_behind_and_a_continuously_trained_one_keeps_up(rows: Rows) -> None:
    frozen = Logistic(rows).fit(np.flatnonzero(rows.hour < HISTORY_HOURS), l2=1e-4)
    following = Logistic(rows)
    following.weights = frozen.weights.copy()
    results = []
    for hour in range(HISTORY_HOURS, HISTORY_HOURS + LIVE_HOURS):
        # Trained on as it goes: each hour, the last model goes on over the hour just past.
        following.fit(np.flatnonzero(rows.hour == hour - 1), l2=3e-3)
        now = np.flatnonzero(rows.hour == hour)
        labels = rows.labels[now]
        results.append(
            (
                auc(frozen.scores(now), labels),
                auc(following.scores(now), labels),
                auc(rows.p_click[now], labels),
            )
        )
    frozen_auc, following_auc, oracle_auc = np.mean(results, axis=0)
    print(f"AUC frozen {frozen_auc:.4f}, following {following_auc:.4f}, oracle {oracle_auc:.4f}")
    assert following_auc - frozen_auc > 0.02, (frozen_auc, following_auc)
    assert oracle_auc > following_auc + 0.01
    assert sum(f < c for f, c, _ in results) == LIVE_HOURS, "behind in every live hour"


def test_a_static_world_does_not_drift() -> None:
    world = SyntheticWorld(seed=3, users=50, items=40, drift=0, new_items=0)
    model = ClickModel(world.users_table(), world.items_table(), world)
    ids = np.arange(40)
    ones = np.ones(40, dtype=np.int32)
    at = [
        model.probability(np.zeros(40), ids, ones, ["ios"] * 40, np.full(40, t)) for t in (0, 1e9)
    ]
    np.testing.assert_array_equal(at[0], at[1])


def test_items_are_shown_only_once_introduced_and_fresh_ones_are_pushed() -> None:
    world = SyntheticWorld(seed=4, users=100, items=300, arrival_days=2, anchor=START)
    model = ClickModel(world.users_table(), world.items_table(), world)
    traffic = Traffic(model, world)
    rng = np.random.default_rng(0)
    t0 = START.timestamp()
    before = traffic.draw(rng, np.full(20_000, t0 - 3600.0))
    assert np.isfinite(model.introduced).sum() == 90  # 30 % of 300 arrive over two days
    assert not np.isfinite(model.introduced[before.item_ids]).any(), "no new item before anchor"
    later = np.full(20_000, t0 + 86400.0)
    shown = traffic.draw(rng, later)
    introduced = model.introduced[shown.item_ids]
    assert (introduced <= later).all()
    fresh = (later - introduced) < 6 * 3600
    assert 0.08 < fresh.mean() < 0.25, "about FRESH_TRAFFIC of impressions go to fresh items"
    # Freshness (which raises P(click)) is whole at an item's introduction and fades in hours.
    new, old = np.flatnonzero(np.isfinite(model.introduced))[:1], np.array([0, 0])
    born = model.introduced[new[0]]
    assert model.freshness(np.repeat(new, 2), np.array([born, born + 86400])).round(3).tolist() == [
        1.0,
        0.018,
    ]
    assert model.freshness(old, np.array([t0, t0 + 86400])).tolist() == [0.0, 0.0]
