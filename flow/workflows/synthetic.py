"""Synthetic CTR data with a learnable signal that drifts: the world, its click model, history.

The world is seeded and reproducible. Users and items have tastes a model can learn (a user's
favourite category, an item's rating, the position on the page, the device); ids follow a Zipf
law, some values are missing, some clicks come late (beyond the attribution window).

Optionally (``interactions``) the click also depends on pairs of columns in a way no sum of
per-column effects can fit, and that no cross feature of the example's feature spec carries:
what a model that learns feature interactions (DLRM, DeepFM, Wide & Deep) should gain over a
logistic regression.

The world also changes, keyed on absolute event time so that an Iceberg history and a later
Kafka stream describe one world: each category's appeal rises and falls over hours, and a share
of the items is introduced over time, pushed and extra appealing while fresh. A model frozen
after a backfill therefore gets worse on later hours, and one trained continuously does not.
Every impression records the probability its click was drawn from (``p_click``), so a trainer
can report the oracle's AUC beside its own. Everything is vectorised with numpy and pyarrow.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flow.errors import ConfigError

__all__ = [
    "CLICKS_SCHEMA",
    "DELAYS",
    "IMPRESSIONS_SCHEMA",
    "ITEMS_SCHEMA",
    "MALFORMED_KINDS",
    "STATIC",
    "USERS_SCHEMA",
    "WORLD_PROPERTY",
    "ClickDelay",
    "ClickModel",
    "Events",
    "Shown",
    "SyntheticWorld",
    "Traffic",
    "simulate",
]

COUNTRIES = ("us", "gb", "de", "fr", "br", "in", "jp", "ng", "mx", "ca", "es", "it")
DEVICES = ("ios", "android", "web")
CATEGORIES = tuple(f"cat_{i:02d}" for i in range(24))
MAX_POSITION = 50
MALFORMED_KINDS = ("not_json", "missing_field", "wrong_type", "out_of_range", "oversized")

WAVES = 3
"""Sinusoids summed into each category's appeal."""
WAVE_PERIOD_HOURS = (6.0, 24.0)
"""Range of their periods (log-uniform). A trainer's newest labels are a label window (plus
the watermark) old, an hour or so: a wave that turns within a few hours no model can follow,
it only adds noise. These turn slowly enough to follow, and fast enough that a model frozen a
few hours ago is off."""
FRESH_HOURS = 6.0
"""How fast a new item's freshness fades (e-folding time of its push and its extra appeal)."""
FRESH_TRAFFIC = 0.15
"""Share of impressions that go to fresh items (while there are any)."""
FRESH_APPEAL = 1.0
"""Extra logit of an item at its introduction, fading with its freshness."""
QUALITY = 0.8
"""Spread (standard deviation, on the logit) of an item's appeal that no column shows."""
DEVICE_CATEGORY = 0.6
"""Spread (standard deviation, on the logit) of the device x item category effect at
``interactions=1``."""
AGE_PRICE = 0.5
"""Logit per (standard deviation of age) x (standard deviation of log price) at
``interactions=1``: older users click dear items more, younger ones cheap items."""
AGE_MEAN, AGE_SD = 36.0, 12.0
"""How ``users_table`` draws ages (before clipping to 16..90): what standardises them."""
LOG_PRICE_MEAN, LOG_PRICE_SD = 3.0, 1.0
"""How ``items_table`` draws log prices: what standardises them."""
WORLD_PROPERTY = "flow.synthetic.world"
"""The Iceberg table property (on the items table) that records the world a history was
drawn from, so a later stream continues it."""

_TS = pa.timestamp("us", tz="UTC")
USERS_SCHEMA = pa.schema(
    [
        pa.field("user_id", pa.int64(), nullable=False),
        pa.field("country", pa.string()),
        pa.field("age", pa.int32()),
        pa.field("favorite_category", pa.string()),
        pa.field("recent_items", pa.list_(pa.int64())),
        pa.field("signup_ts", _TS),
    ]
)
ITEMS_SCHEMA = pa.schema(
    [
        pa.field("item_id", pa.int64(), nullable=False),
        pa.field("category", pa.string()),
        pa.field("brand", pa.string()),
        pa.field("price", pa.float64()),
        pa.field("rating", pa.float64()),
    ]
)
IMPRESSIONS_SCHEMA = pa.schema(
    [
        pa.field("impression_id", pa.string(), nullable=False),
        pa.field("user_id", pa.int64(), nullable=False),
        pa.field("item_id", pa.int64(), nullable=False),
        pa.field("ts", _TS, nullable=False),
        pa.field("position", pa.int32()),
        pa.field("device", pa.string()),
        # The truth the click was drawn from: an oracle's score, never a feature.
        pa.field("p_click", pa.float64()),
    ]
)
CLICKS_SCHEMA = pa.schema(
    [
        pa.field("impression_id", pa.string(), nullable=False),
        pa.field("ts", _TS, nullable=False),
    ]
)


def _zipf_probabilities(n: int, exponent: float) -> np.ndarray:
    weights: np.ndarray = 1.0 / np.arange(1, n + 1) ** exponent
    normalised: np.ndarray = weights / weights.sum()
    return normalised


def _with_nulls(values: list[Any], rng: np.random.Generator, share: float) -> list[Any]:
    mask = rng.random(len(values)) < share
    return [None if m else v for v, m in zip(values, mask, strict=True)]


def _seconds(ts: np.ndarray) -> np.ndarray:
    """Event times as float seconds since the Unix epoch (from datetime64, or already seconds)."""
    if ts.dtype.kind == "M":
        micros = ts.astype("datetime64[us]").astype(np.int64)
        as_seconds: np.ndarray = micros / 1e6
        return as_seconds
    return np.asarray(ts, dtype=np.float64)


def _timestamps(secs: np.ndarray) -> pa.Array:
    """Float seconds since the Unix epoch as a UTC timestamp column (microseconds)."""
    micros = np.round(secs * 1e6).astype(np.int64)
    return pa.array(micros.view("datetime64[us]"), type=_TS)


@dataclass(frozen=True)
class SyntheticWorld:
    """The users and items, and how the world changes over time; reproducible from the seed.

    ``SyntheticWorld(drift=0, new_items=0)`` is a static world: P(click) never changes.
    """

    seed: int = 7
    users: int = 10_000
    items: int = 2_000
    zipf: float = 1.1
    """Exponent of the id popularity law (higher: more skew)."""
    drift: float = 0.7
    """Typical amplitude, on the logit, of each of the waves in a category's appeal (0: the
    appeal never changes). Their sum has a standard deviation of about 1.3 x drift: at 0.7 a
    category's click rate is often twice, or half, what it was half a day before."""
    new_items: float = 0.3
    """Share of the items introduced one by one over ``arrival_days`` from ``anchor`` (0: all
    items exist from the start). Impressions draw only items introduced by their time."""
    arrival_days: float = 14.0
    """How long the new items take to arrive, evenly spread, from ``anchor``."""
    interactions: float = 0.0
    """Scale of two effects on the logit that are not additive in any column (0: none, the
    world as before this option). A seeded effect per (device, item category) pair, centred
    so that it has no per-device or per-category part, of standard deviation
    ``DEVICE_CATEGORY x interactions``; and ``AGE_PRICE x interactions x z(age) x z(log
    price)``, z standardising by how the tables draw them (a missing age or price: 0). No
    cross feature of ``pipelines/ctr.py`` carries either pair, so a model has to learn them."""
    anchor: datetime | None = None
    """When the first new item arrives. ``write_history`` sets it to the start of the history
    it writes and records the world with the items table, so a later stream continues it."""

    def __post_init__(self) -> None:
        if self.users < 1 or self.items < 1:
            raise ConfigError(
                f"SyntheticWorld(users={self.users}, items={self.items}): need at least one each"
            )
        if self.drift < 0:
            raise ConfigError(f"SyntheticWorld.drift={self.drift} must be >= 0 (0: no waves)")
        if not 0 <= self.new_items < 1:
            raise ConfigError(
                f"SyntheticWorld.new_items={self.new_items} must be in [0, 1): some items must "
                "exist from the start"
            )
        if self.interactions < 0:
            raise ConfigError(
                f"SyntheticWorld.interactions={self.interactions} must be >= 0 (0: none)"
            )
        if self.arrival_days <= 0:
            raise ConfigError(f"SyntheticWorld.arrival_days={self.arrival_days} must be > 0")
        if self.anchor is not None and self.anchor.tzinfo is None:
            raise ConfigError(
                f"SyntheticWorld.anchor={self.anchor} has no time zone; pass an aware datetime "
                "(tzinfo=UTC)"
            )

    def anchored(self, at: datetime) -> SyntheticWorld:
        """This world, with its new items arriving from ``at`` unless it already has an anchor."""
        return self if self.anchor is not None else replace(self, anchor=at)

    def to_property(self) -> str:
        """The world as JSON, for ``WORLD_PROPERTY`` (see ``from_property``)."""
        fields = asdict(self)
        fields["anchor"] = self.anchor.isoformat() if self.anchor else None
        return json.dumps(fields, sort_keys=True)

    @classmethod
    def from_property(cls, text: str) -> SyntheticWorld:
        fields = json.loads(text)
        if fields.get("anchor"):
            fields["anchor"] = datetime.fromisoformat(fields["anchor"])
        try:
            return cls(**fields)
        except TypeError as exc:  # recorded by another version of flow, with other fields
            raise ConfigError(
                f"the world recorded in table property {WORLD_PROPERTY} ({text}) does not fit "
                f"this version's SyntheticWorld ({exc}); regenerate with `flow generate history`"
            ) from exc

    def users_table(self) -> pa.Table:
        rng = np.random.default_rng([self.seed, 1])
        country_p = _zipf_probabilities(len(COUNTRIES), 1.0)
        countries = rng.choice(COUNTRIES, size=self.users, p=country_p).tolist()
        ages = np.clip(rng.normal(36, 12, self.users), 16, 90).astype(np.int32).tolist()
        favorites = rng.choice(CATEGORIES, size=self.users).tolist()
        recent_len = rng.integers(0, 12, self.users)
        recent = [rng.integers(0, self.items, k).tolist() for k in recent_len]
        epoch = datetime(2024, 1, 1, tzinfo=UTC)
        signup = [
            epoch + timedelta(seconds=int(s)) for s in rng.integers(0, 600 * 86400, self.users)
        ]
        return pa.table(
            {
                "user_id": np.arange(self.users, dtype=np.int64),
                "country": _with_nulls(countries, rng, 0.02),
                "age": _with_nulls(ages, rng, 0.05),
                "favorite_category": favorites,
                "recent_items": recent,
                "signup_ts": signup,
            },
            schema=USERS_SCHEMA,
        )

    def items_table(self) -> pa.Table:
        """Every item, those introduced later included (so enrichment finds them all)."""
        rng = np.random.default_rng([self.seed, 2])
        categories = rng.choice(CATEGORIES, size=self.items).tolist()
        brands = [f"brand_{b:03d}" for b in rng.integers(0, 200, self.items)]
        prices = np.round(rng.lognormal(3.0, 1.0, self.items), 2).tolist()
        ratings = np.round(np.clip(rng.beta(5, 2, self.items) * 5, 0, 5), 2).tolist()
        return pa.table(
            {
                "item_id": np.arange(self.items, dtype=np.int64),
                "category": categories,
                "brand": _with_nulls(brands, rng, 0.03),
                "price": _with_nulls(prices, rng, 0.01),
                "rating": ratings,
            },
            schema=ITEMS_SCHEMA,
        )


STATIC = SyntheticWorld(drift=0.0, new_items=0.0)


@dataclass(frozen=True)
class ClickDelay:
    """How long after its impression a click happens: what a trainer's evaluation (and a label
    window) needs to know about the stream."""

    mean_s: float = 45.0
    """Mean of the exponential delay of an ordinary click."""
    late_share: float = 0.04
    """Share of clicks that come beyond the attribution window (they must label nothing)."""
    window: timedelta = timedelta(minutes=30)
    """The attribution window the late clicks miss."""
    late_range: tuple[float, float] = (1.2, 3.0)
    """A late click's delay, in multiples of ``window`` (uniform)."""

    def __post_init__(self) -> None:
        if self.mean_s <= 0 or not 0 <= self.late_share < 1:
            raise ConfigError(
                f"ClickDelay(mean_s={self.mean_s}, late_share={self.late_share}): mean_s must be "
                "> 0 and late_share in [0, 1)"
            )
        if not 1 < self.late_range[0] <= self.late_range[1]:
            raise ConfigError(
                f"ClickDelay.late_range={self.late_range}: late clicks must land beyond the "
                "window (both above 1, in order)"
            )

    def draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` delays in seconds, and which of them are late."""
        delays = rng.exponential(self.mean_s, n)
        late = rng.random(n) < self.late_share
        window = self.window.total_seconds()
        delays[late] = window * rng.uniform(*self.late_range, int(late.sum()))
        return delays, late

    def describe(self) -> dict[str, float]:
        """The distribution in numbers (for reports and run parameters)."""
        window = self.window.total_seconds()
        late_mean = window * sum(self.late_range) / 2
        return {
            "mean_s": (1 - self.late_share) * self.mean_s + self.late_share * late_mean,
            "ordinary_mean_s": self.mean_s,
            "late_share": self.late_share,
            "window_s": window,
            "late_min_s": window * self.late_range[0],
            "late_max_s": window * self.late_range[1],
        }


DELAYS = ClickDelay()
"""The delays every generator uses unless told otherwise."""


def _codes(values: list[Any], vocabulary: tuple[str, ...]) -> np.ndarray:
    """Index of each value in ``vocabulary``; -1 for a missing or unknown one."""
    index = {v: k for k, v in enumerate(vocabulary)}
    return np.array([index.get(v, -1) for v in values], dtype=np.int64)


def _rows_of(ids: np.ndarray, sorted_ids: np.ndarray, what: str) -> np.ndarray:
    rows = np.searchsorted(sorted_ids, ids)
    rows = np.minimum(rows, len(sorted_ids) - 1)
    if len(ids) and not np.array_equal(sorted_ids[rows], ids):
        unknown = ids[sorted_ids[rows] != ids][:3].tolist()
        raise ConfigError(f"{what} id(s) {unknown} are not in the {what}s table")
    return rows


class ClickModel:
    """P(click) from what the tables say (taste match, rating, position, device, country) and
    from when (each category's appeal over the hours, a new item's freshness)."""

    BASE = -2.4

    def __init__(self, users: pa.Table, items: pa.Table, world: SyntheticWorld = STATIC) -> None:
        # Rows in id order, so a table read back from Iceberg in another order is the same world.
        users = users.sort_by("user_id")
        items = items.sort_by("item_id")
        self.user_ids = users.column("user_id").to_numpy()
        self.item_ids = items.column("item_id").to_numpy()
        self.favorite = _codes(users.column("favorite_category").to_pylist(), CATEGORIES)
        country = users.column("country").fill_null("").to_pylist()
        self.country_effect = np.array([0.3 if c in ("us", "gb", "ca") else 0.0 for c in country])
        self.category = _codes(items.column("category").to_pylist(), CATEGORIES)
        self.rating = items.column("rating").fill_null(3.0).to_numpy()
        rng = np.random.default_rng([world.seed, 6])
        # What no column says about an item, only its clicks: a model learns it per item id, so
        # an item it has never seen (a new one) it can only guess.
        self.quality = rng.normal(0.0, QUALITY, len(self.item_ids))
        shape = (len(CATEGORIES) + 1, WAVES)  # the last row: items without a category
        low, high = np.log(WAVE_PERIOD_HOURS)
        self.amplitude = world.drift * rng.uniform(0.5, 1.5, shape)
        self.amplitude[-1] = 0.0
        self.period_s = np.exp(rng.uniform(low, high, shape)) * 3600
        self.phase = rng.uniform(0, 2 * np.pi, shape)
        self.introduced = self._introductions(world)
        self.interactions = world.interactions
        if self.interactions:
            self._interaction_tables(users, items, world)

    def _interaction_tables(self, users: pa.Table, items: pa.Table, world: SyntheticWorld) -> None:
        """What ``interactions`` reads: the device x category table, standardised ages and log
        prices. A stream of its own, so the rest of the world is the same with or without."""
        rng = np.random.default_rng([world.seed, 10])
        table = rng.normal(0.0, 1.0, (len(DEVICES), len(CATEGORIES)))
        # Centred on both axes: a per-device or per-category mean is a main effect, which a
        # logistic regression fits; what is left only a model of the pair can.
        table -= table.mean(axis=0, keepdims=True)
        table -= table.mean(axis=1, keepdims=True)
        table *= DEVICE_CATEGORY * world.interactions / table.std()
        # The last row and column: no device, no category (no effect).
        self.device_category = np.zeros((len(DEVICES) + 1, len(CATEGORIES) + 1))
        self.device_category[:-1, :-1] = table
        age = users.column("age").to_numpy(zero_copy_only=False).astype(np.float64)
        self.age_z = np.nan_to_num((age - AGE_MEAN) / AGE_SD)
        price = items.column("price").to_numpy(zero_copy_only=False).astype(np.float64)
        log_price = np.log(np.maximum(price, 0.01))  # prices are rounded to cents
        self.price_z = np.nan_to_num((log_price - LOG_PRICE_MEAN) / LOG_PRICE_SD)

    def interaction(
        self, user_rows: np.ndarray, item_rows: np.ndarray, device: list[Any] | np.ndarray
    ) -> np.ndarray:
        """The logit ``interactions`` adds (rows into the sorted users and items tables)."""
        if not self.interactions:
            return np.zeros(len(user_rows))
        dev = _codes(list(device), DEVICES)
        category = self.category[item_rows]
        pair = self.device_category[dev, category]  # -1: the last row / column, no effect
        product = self.age_z[user_rows] * self.price_z[item_rows]
        total: np.ndarray = pair + AGE_PRICE * self.interactions * product
        return total

    def _introductions(self, world: SyntheticWorld) -> np.ndarray:
        """Each item's introduction time (seconds since the Unix epoch; -inf: from the start)."""
        introduced = np.full(len(self.item_ids), -np.inf)
        arriving = round(world.new_items * len(self.item_ids))
        if arriving == 0:
            return introduced
        if world.anchor is None:
            raise ConfigError(
                f"SyntheticWorld.anchor is not set, and new_items={world.new_items} arrive from "
                "it: pass anchor=<datetime> (write_history sets it to the start of its history), "
                "or new_items=0"
            )
        rng = np.random.default_rng([world.seed, 7])
        chosen = rng.permutation(len(self.item_ids))[:arriving]
        span = world.arrival_days * 86400
        spaced = (np.arange(arriving) + rng.uniform(0, 1, arriving)) / arriving * span
        introduced[chosen] = world.anchor.timestamp() + spaced
        return introduced

    def appeal(self, category: np.ndarray, secs: np.ndarray) -> np.ndarray:
        """The logit each category code adds at each time: a sum of seeded sinusoids."""
        c = np.where(category >= 0, category, len(CATEGORIES))
        waves = self.amplitude[c] * np.sin(
            2 * np.pi * secs[:, None] / self.period_s[c] + self.phase[c]
        )
        total: np.ndarray = waves.sum(axis=1)
        return total

    def freshness(self, item_rows: np.ndarray, secs: np.ndarray) -> np.ndarray:
        """1 at an item's introduction, fading over ``FRESH_HOURS``; 0 for the original items."""
        age = np.maximum(secs - self.introduced[item_rows], 0.0)
        fresh: np.ndarray = np.exp(-age / (FRESH_HOURS * 3600))
        return fresh

    def probability(
        self,
        user_ids: np.ndarray,
        item_ids: np.ndarray,
        position: np.ndarray,
        device: list[Any] | np.ndarray,
        ts: np.ndarray,
    ) -> np.ndarray:
        """P(click) of each impression; ``ts``: event times (datetime64, or epoch seconds)."""
        u = _rows_of(np.asarray(user_ids, dtype=np.int64), self.user_ids, "user")
        i = _rows_of(np.asarray(item_ids, dtype=np.int64), self.item_ids, "item")
        secs = _seconds(np.asarray(ts))
        dev = np.asarray(device, dtype=object)
        category = self.category[i]
        logit = (
            self.BASE
            + 1.6 * ((self.favorite[u] == category) & (category >= 0))
            + 0.9 * (self.rating[i] - 3.5)
            + self.quality[i]
            - 0.6 * np.log(np.asarray(position, dtype=np.float64))
            + np.where(dev == "ios", 0.25, np.where(dev == "web", -0.2, 0.0))
            + self.country_effect[u]
            + self.appeal(category, secs)
            + FRESH_APPEAL * self.freshness(i, secs)
        )
        if self.interactions:  # not even + 0.0: the world without them stays bit for bit
            logit = logit + self.interaction(u, i, dev)
        probability: np.ndarray = 1.0 / (1.0 + np.exp(-logit))
        return probability


@dataclass
class Shown:
    """Who was shown what, where and on which device (one entry per impression)."""

    user_ids: np.ndarray
    item_ids: np.ndarray
    position: np.ndarray
    device: list[str | None]


class Traffic:
    """Who is shown what, when: users and items by a Zipf law over a seeded popularity order
    (one order for the world, so history and stream agree), an item only once it is
    introduced, and a ``FRESH_TRAFFIC`` share pushed to items introduced in the last hours."""

    _MAX_REDRAWS = 64

    def __init__(self, model: ClickModel, world: SyntheticWorld) -> None:
        self.model = model
        rng = np.random.default_rng([world.seed, 8])
        # Popularity ranks map to ids through a permutation, so popular ids are not 0, 1, 2.
        self.user_by_rank = rng.permutation(len(model.user_ids))
        self.item_by_rank = rng.permutation(len(model.item_ids))
        self.user_cdf = np.cumsum(_zipf_probabilities(len(model.user_ids), world.zipf))
        self.item_cdf = np.cumsum(_zipf_probabilities(len(model.item_ids), world.zipf))
        arriving = np.flatnonzero(np.isfinite(model.introduced))
        by_time = np.argsort(model.introduced[arriving])
        self.new_rows = arriving[by_time]
        self.new_times = model.introduced[self.new_rows]

    @staticmethod
    def _pick(rng: np.random.Generator, cdf: np.ndarray, n: int) -> np.ndarray:
        picked: np.ndarray = np.minimum(np.searchsorted(cdf, rng.random(n)), len(cdf) - 1)
        return picked

    def draw(self, rng: np.random.Generator, secs: np.ndarray) -> Shown:
        """One impression per event time in ``secs`` (epoch seconds)."""
        n = len(secs)
        users = self.user_by_rank[self._pick(rng, self.user_cdf, n)]
        items = self.item_by_rank[self._pick(rng, self.item_cdf, n)]
        # Drawing again where the item did not exist yet samples the Zipf law restricted to the
        # items that did (the original items always do, so this ends quickly).
        for _ in range(self._MAX_REDRAWS):
            unborn = np.flatnonzero(self.model.introduced[items] > secs)
            if len(unborn) == 0:
                break
            items[unborn] = self.item_by_rank[self._pick(rng, self.item_cdf, len(unborn))]
        else:
            original = np.flatnonzero(~np.isfinite(self.model.introduced))
            unborn = np.flatnonzero(self.model.introduced[items] > secs)
            items[unborn] = original[rng.integers(0, len(original), len(unborn))]
        if len(self.new_rows):
            # A pushed impression goes to the newest item at least a random (exponential) age
            # old, so items get the push in proportion to their freshness.
            pushed = np.flatnonzero(rng.random(n) < FRESH_TRAFFIC)
            age = rng.exponential(FRESH_HOURS * 3600, len(pushed))
            k = np.searchsorted(self.new_times, secs[pushed] - age, side="right") - 1
            found = k >= 0
            k = np.maximum(k, 0)
            fresh = found & (secs[pushed] - self.new_times[k] < 3 * FRESH_HOURS * 3600)
            items[pushed[fresh]] = self.new_rows[k[fresh]]
        position = np.minimum(rng.geometric(0.25, n), MAX_POSITION).astype(np.int32)
        device = _with_nulls(rng.choice(DEVICES, n, p=[0.45, 0.4, 0.15]).tolist(), rng, 0.03)
        return Shown(self.model.user_ids[users], self.model.item_ids[items], position, device)


@dataclass
class Events:
    """Impressions and the clicks they drew (ground truth, late clicks included)."""

    impressions: pa.Table
    clicks: pa.Table
    late_clicks: int = 0
    """Clicks whose event time is beyond the attribution window (they must label nothing)."""


def simulate(
    users: pa.Table,
    items: pa.Table,
    *,
    count: int,
    start: datetime,
    span: timedelta,
    seed: int,
    world: SyntheticWorld = STATIC,
    delay: ClickDelay = DELAYS,
    id_prefix: str = "imp",
) -> Events:
    """``count`` impressions spread over ``[start, start + span)``, and their clicks.

    ``world`` says how P(click) and the catalogue change with time; ``users`` and ``items``
    are the dimension tables as they stand (``update_users`` may have changed them).
    """
    rng = np.random.default_rng([seed, 3])
    model = ClickModel(users, items, world)
    secs = start.timestamp() + np.sort(rng.random(count)) * span.total_seconds()
    shown = Traffic(model, world).draw(rng, secs)
    p_click = model.probability(shown.user_ids, shown.item_ids, shown.position, shown.device, secs)
    ids = [f"{id_prefix}-{seed}-{i:09d}" for i in range(count)]
    impressions = pa.table(
        {
            "impression_id": ids,
            "user_id": shown.user_ids.astype(np.int64),
            "item_id": shown.item_ids.astype(np.int64),
            "ts": _timestamps(secs),
            "position": shown.position,
            "device": shown.device,
            "p_click": p_click,
        },
        schema=IMPRESSIONS_SCHEMA,
    )
    clicked = rng.random(count) < p_click
    delays, late = delay.draw(rng, count)
    index = np.flatnonzero(clicked)
    clicks = pa.table(
        {
            "impression_id": pa.array(ids).take(pa.array(index)),
            "ts": _timestamps(secs[index] + delays[index]),
        },
        schema=CLICKS_SCHEMA,
    )
    order = pc.sort_indices(clicks, [("ts", "ascending")])
    return Events(impressions, clicks.take(order), late_clicks=int((clicked & late).sum()))
