"""Synthetic events as a stream of Kafka records, back-dated over a span.

``encode_stream`` turns simulated events (event times over a span) into records in event-time
order; it knows nothing of Kafka (``flow.workflows.loading`` sends them).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from flow.workflows.synthetic import DELAYS, MALFORMED_KINDS, ClickDelay, Events

__all__ = [
    "StreamPlan",
    "StreamReport",
    "encode_stream",
    "pace",
]


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
class StreamReport:
    """What a stream sent, and what a trainer's evaluation needs to know about it."""

    impressions: int = 0
    clicks: int = 0
    malformed: Counter[str] = field(default_factory=Counter)
    """Malformed impressions by kind (counted in ``impressions``)."""
    late_clicks: int = 0
    """Clicks sent whose delay is beyond the attribution window (they label nothing)."""
    late_arrivals: int = 0
    """Records sent out of event-time order (held back, as by a slow producer)."""
    first_ts: datetime | None = None
    last_ts: datetime | None = None
    """Event times of the first and the last impression."""
    seconds: float = 0.0
    delay: ClickDelay = DELAYS
    """The click delay distribution the clicks were drawn from."""

    @property
    def valid_impressions(self) -> int:
        return self.impressions - sum(self.malformed.values())

    def delay_summary(self) -> str:
        d = self.delay.describe()
        return (
            f"click delay: exponential, mean {d['ordinary_mean_s']:.0f}s; "
            f"{d['late_share']:.0%} late ({d['late_min_s'] / 60:.0f}-{d['late_max_s'] / 60:.0f} "
            f"min, beyond the {d['window_s'] / 60:.0f}-minute window); overall mean "
            f"{d['mean_s']:.0f}s"
        )


# -- back-dated: simulated events in event-time order ------------------------------------------


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
