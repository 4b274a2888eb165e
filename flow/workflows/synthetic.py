"""Synthetic CTR data with a learnable signal: dimensions, Iceberg history, a Kafka stream.

The world is seeded and reproducible. Users and items have tastes a model can learn (a user's
favourite category, an item's rating, the position on the page, the device); ids follow a Zipf
law, some values are missing, some clicks come late (beyond the attribution window), and a
chosen share of Kafka records is malformed in the ways real producers break. Everything is
vectorised with numpy and written with pyarrow, pyiceberg and the Kafka producer.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "CLICKS_SCHEMA",
    "IMPRESSIONS_SCHEMA",
    "ITEMS_SCHEMA",
    "MALFORMED_KINDS",
    "USERS_SCHEMA",
    "ClickModel",
    "Events",
    "SyntheticWorld",
    "encode_stream",
    "simulate",
]

COUNTRIES = ("us", "gb", "de", "fr", "br", "in", "jp", "ng", "mx", "ca", "es", "it")
DEVICES = ("ios", "android", "web")
CATEGORIES = tuple(f"cat_{i:02d}" for i in range(24))
MAX_POSITION = 50
MALFORMED_KINDS = ("not_json", "missing_field", "wrong_type", "out_of_range", "oversized")

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


def _with_nulls(values: Sequence[object], rng: np.random.Generator, share: float) -> list[object]:
    mask = rng.random(len(values)) < share
    return [None if m else v for v, m in zip(values, mask, strict=True)]


@dataclass(frozen=True)
class SyntheticWorld:
    """The users and items, reproducible from the seed."""

    seed: int = 7
    users: int = 10_000
    items: int = 2_000
    zipf: float = 1.1
    """Exponent of the id popularity law (higher: more skew)."""

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


class ClickModel:
    """P(click) from what the tables say: taste match, rating, position, device, country."""

    BASE = -2.4

    def __init__(self, users: pa.Table, items: pa.Table) -> None:
        self.user_ids = users.column("user_id").to_numpy()
        self.item_ids = items.column("item_id").to_numpy()
        self._user_row = {int(u): i for i, u in enumerate(self.user_ids)}
        self._item_row = {int(i): r for r, i in enumerate(self.item_ids)}
        self.favorite = np.array(users.column("favorite_category").to_pylist(), dtype=object)
        country = users.column("country").fill_null("").to_pylist()
        self.country_effect = np.array([0.3 if c in ("us", "gb", "ca") else 0.0 for c in country])
        self.category = np.array(items.column("category").to_pylist(), dtype=object)
        self.rating = items.column("rating").fill_null(3.0).to_numpy()

    def probability(
        self, user_ids: np.ndarray, item_ids: np.ndarray, position: np.ndarray, device: list[object]
    ) -> np.ndarray:
        u = np.fromiter((self._user_row[int(x)] for x in user_ids), dtype=np.int64)
        i = np.fromiter((self._item_row[int(x)] for x in item_ids), dtype=np.int64)
        logit = (
            self.BASE
            + 1.6 * (self.favorite[u] == self.category[i])
            + 0.9 * (self.rating[i] - 3.5)
            - 0.6 * np.log(position)
            + np.array([0.25 if d == "ios" else (-0.2 if d == "web" else 0.0) for d in device])
            + self.country_effect[u]
        )
        probability: np.ndarray = 1.0 / (1.0 + np.exp(-logit))
        return probability


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
    zipf: float = 1.1,
    click_delay_s: float = 45.0,
    late_click_share: float = 0.04,
    window: timedelta = timedelta(minutes=30),
    id_prefix: str = "imp",
) -> Events:
    """``count`` impressions spread over ``[start, start + span)``, and their clicks."""
    rng = np.random.default_rng([seed, 3])
    model = ClickModel(users, items)
    # Popularity ranks map to ids through a permutation, so popular ids are not simply 0, 1, 2.
    user_rank = rng.permutation(model.user_ids)
    item_rank = rng.permutation(model.item_ids)
    user_ids = user_rank[
        rng.choice(len(user_rank), count, p=_zipf_probabilities(len(user_rank), zipf))
    ]
    item_ids = item_rank[
        rng.choice(len(item_rank), count, p=_zipf_probabilities(len(item_rank), zipf))
    ]
    offsets = np.sort(rng.random(count)) * span.total_seconds()
    ts = [start + timedelta(seconds=float(o)) for o in offsets]
    position = np.minimum(rng.geometric(0.25, count), MAX_POSITION).astype(np.int32)
    device = _with_nulls(rng.choice(DEVICES, count, p=[0.45, 0.4, 0.15]).tolist(), rng, 0.03)
    ids = [f"{id_prefix}-{seed}-{i:09d}" for i in range(count)]
    impressions = pa.table(
        {
            "impression_id": ids,
            "user_id": user_ids.astype(np.int64),
            "item_id": item_ids.astype(np.int64),
            "ts": ts,
            "position": position,
            "device": device,
        },
        schema=IMPRESSIONS_SCHEMA,
    )
    clicked = rng.random(count) < model.probability(user_ids, item_ids, position, device)
    delays = rng.exponential(click_delay_s, count)
    late = rng.random(count) < late_click_share
    delays[late] = window.total_seconds() * rng.uniform(1.2, 3.0, int(late.sum()))
    index = np.flatnonzero(clicked)
    clicks = pa.table(
        {
            "impression_id": [ids[k] for k in index],
            "ts": [ts[k] + timedelta(seconds=float(delays[k])) for k in index],
        },
        schema=CLICKS_SCHEMA,
    )
    order = pc.sort_indices(clicks, [("ts", "ascending")])
    return Events(impressions, clicks.take(order), late_clicks=int((clicked & late).sum()))


# -- the Kafka stream --------------------------------------------------------------------------


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _malformed(record: dict[str, object], kind: str, max_bytes: int) -> bytes:
    """One record broken the way ``kind`` says."""
    if kind == "not_json":
        return b"\x00{impression_id: " + str(record["impression_id"]).encode() + b" <truncated"
    broken = dict(record)
    if kind == "missing_field":
        del broken["user_id"]
    elif kind == "wrong_type":
        broken["item_id"] = f"item-{broken['item_id']}"
    elif kind == "out_of_range":
        broken["position"] = -int(str(broken["position"]))
    elif kind == "oversized":
        broken["debug"] = "x" * (max_bytes + 100)
    return json.dumps(broken).encode()


@dataclass
class StreamPlan:
    """What ``encode_stream`` will send, and what it counts."""

    produced: Counter[str] = field(default_factory=Counter)
    malformed: Counter[str] = field(default_factory=Counter)
    """Malformed impressions by kind."""
    late_arrivals: int = 0
    """Records sent out of event-time order."""
    first_ts: datetime | None = None
    last_ts: datetime | None = None


def encode_stream(
    events: Events,
    *,
    malformed_share: float = 0.0,
    max_payload_bytes: int = 64 * 1024,
    late_arrival_share: float = 0.0,
    late_arrival: timedelta = timedelta(minutes=3),
    seed: int = 0,
    plan: StreamPlan | None = None,
) -> Iterator[tuple[str, str, bytes, datetime]]:
    """``(kind, key, payload, event time)`` in send order: impressions and clicks interleaved.

    Records go out in event-time order, except a ``late_arrival_share`` of them that is held
    back by up to ``late_arrival`` (as a slow producer or a network partition would): they
    arrive out of order, which a watermark longer than ``late_arrival`` absorbs. A
    ``malformed_share`` of impressions is sent broken (cycling through ``MALFORMED_KINDS``); their
    clicks are not sent, since the impression never validly existed.
    """
    plan = plan if plan is not None else StreamPlan()
    rng = np.random.default_rng([seed, 4])
    imps = events.impressions.to_pylist()
    broken = rng.random(len(imps)) < malformed_share
    kinds = iter(MALFORMED_KINDS * (len(imps) // len(MALFORMED_KINDS) + 1))
    skip = {r["impression_id"] for r, b in zip(imps, broken, strict=True) if b}
    clicks = [c for c in events.clicks.to_pylist() if c["impression_id"] not in skip]
    records: list[tuple[datetime, int, str, dict[str, Any], bool]] = [
        (imp["ts"], k, "impressions", imp, bool(broken[k])) for k, imp in enumerate(imps)
    ] + [(c["ts"], len(imps) + k, "clicks", c, False) for k, c in enumerate(clicks)]
    held = rng.random(len(records)) < late_arrival_share
    holds = np.where(held, rng.uniform(0, late_arrival.total_seconds(), len(records)), 0.0)
    send_at = [records[k][0] + timedelta(seconds=float(holds[k])) for k in range(len(records))]
    order = sorted(range(len(records)), key=lambda k: (send_at[k], records[k][1]))
    plan.late_arrivals = int(held.sum())
    for k in order:
        event_time, _, kind, record, is_broken = records[k]
        if kind == "clicks":
            payload = {"impression_id": record["impression_id"], "ts": _iso(event_time)}
            plan.produced["clicks"] += 1
            yield "clicks", record["impression_id"], json.dumps(payload).encode(), event_time
            continue
        encoded = {**record, "ts": _iso(event_time)}
        if is_broken:
            kind_broken = next(kinds)
            payload_bytes = _malformed(encoded, kind_broken, max_payload_bytes)
            plan.malformed[kind_broken] += 1
        else:
            payload_bytes = json.dumps(encoded).encode()
        plan.produced["impressions"] += 1
        plan.first_ts = min(plan.first_ts or event_time, event_time)
        plan.last_ts = max(plan.last_ts or event_time, event_time)
        yield "impressions", record["impression_id"], payload_bytes, event_time


def pace(rate: float, clock: Callable[[], float] = time.monotonic) -> Callable[[int], None]:
    """A function that sleeps so that ``n`` calls take ``n / rate`` seconds (rate 0: never)."""
    started = clock()

    def wait(sent: int) -> None:
        if rate > 0:
            ahead = sent / rate - (clock() - started)
            if ahead > 0:
                time.sleep(min(ahead, 1.0))

    return wait
