"""Synthetic events as a stream of Kafka records: back-dated, or in real time.

``encode_stream`` turns simulated events (event times over a span) into records in event-time
order. ``stream_realtime`` is a live source instead: impressions are stamped with the wall
clock when they are sent, and each click is sent when it comes due (its impression's time plus
a delay from ``ClickDelay``), so clicks arrive minutes after their impressions as in
production. Both hand records to a ``send`` callable and know nothing of Kafka, so tests and
benchmarks run them with a stub, and the clock and the sleep are injectable.
"""

from __future__ import annotations

import heapq
import json
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import count as counter
from itertools import cycle
from typing import Any

import numpy as np
import pyarrow as pa

from flow.errors import ConfigError
from flow.workflows.synthetic import (
    DELAYS,
    MALFORMED_KINDS,
    ClickDelay,
    ClickModel,
    Events,
    SyntheticWorld,
    Traffic,
)

__all__ = [
    "Realtime",
    "Send",
    "StreamPlan",
    "StreamReport",
    "encode_stream",
    "pace",
    "stream_realtime",
]

Send = Callable[[str, str, bytes], None]
"""Where a record goes: ``send(kind, key, payload)``, kind "impressions" or "clicks"."""


def _quiet(_: str) -> None:
    return None


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _iso_s(epoch_s: float) -> str:
    return _iso(datetime.fromtimestamp(epoch_s, UTC))


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
    pending_clicks: int = 0
    """Real time: clicks drawn but not yet due when the stream stopped; never sent."""
    first_ts: datetime | None = None
    last_ts: datetime | None = None
    """Event times of the first and the last impression."""
    seconds: float = 0.0
    max_lag_s: float = 0.0
    """Real time: the furthest sending fell behind the schedule the rate sets."""
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


# -- real time: stamped when sent, clicks when due ---------------------------------------------


@dataclass(frozen=True)
class Realtime:
    """How a real-time stream runs."""

    rate: float = 2000.0
    """Impressions per second (their clicks come on top)."""
    duration: float | None = None
    """Seconds to run; None: until ``count`` impressions, or until interrupted (Ctrl-C)."""
    count: int | None = None
    """Impressions to send; None: until ``duration``, or until interrupted."""
    malformed_share: float = 0.0
    """Share of impressions sent broken (cycling through ``MALFORMED_KINDS``); their clicks are
    not sent."""
    late_arrival_share: float = 0.0
    """Share of records held back by up to ``late_arrival`` (sent out of event-time order)."""
    late_arrival: timedelta = timedelta(minutes=3)
    drain: float = 0.0
    """Seconds after ``duration`` during which clicks still go out as they come due (no new
    impressions): the clicks of the last impressions arrive, as they would in a stream that
    goes on, so their impressions' labels are complete."""
    max_payload_bytes: int = 64 * 1024
    """What an "oversized" malformed record exceeds."""
    seed: int = 11
    progress_every: float = 5.0
    """Seconds between progress lines."""
    chunk: float = 1.0
    """Seconds of impressions generated at once (vectorised)."""
    tick: float = 0.01
    """The shortest sleep: records due within it go out together, with one time stamp."""

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ConfigError(f"Realtime.rate={self.rate}: impressions per second must be > 0")
        if self.duration is not None and self.duration <= 0:
            raise ConfigError(f"Realtime.duration={self.duration} must be > 0 seconds, or None")
        if self.count is not None and self.count < 1:
            raise ConfigError(f"Realtime.count={self.count} must be >= 1, or None")
        for name in ("malformed_share", "late_arrival_share"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise ConfigError(f"Realtime.{name}={value} must be in [0, 1)")
        if self.drain < 0:
            raise ConfigError(f"Realtime.drain={self.drain} must be >= 0 seconds")
        if self.chunk <= 0 or self.tick <= 0 or self.progress_every <= 0:
            raise ConfigError(
                f"Realtime(chunk={self.chunk}, tick={self.tick}, progress_every="
                f"{self.progress_every}): all must be > 0 seconds"
            )


# An impression's JSON, as json.dumps writes the record (same keys, order and separators).
_IMPRESSION = (
    '{{"impression_id": "{}", "user_id": {}, "item_id": {}, "ts": "{}", "position": {}, '
    '"device": {}, "p_click": {}}}'
)
_CLICK = '{{"impression_id": "{}", "ts": "{}"}}'


@dataclass
class _Chunk:
    """A chunk of scheduled impressions, drawn at once; lists, since they are read one by one."""

    due: list[float]
    ids: list[str]
    users: list[int]
    items: list[int]
    positions: list[int]
    devices: list[str | None]
    p_click: list[float]
    click_delay: list[float]
    """Seconds from the impression to its click; NaN: no click (or the impression is broken)."""
    late: list[bool]
    broken: list[bool]
    hold: list[float]
    """Seconds the impression is held back (late arrival); 0: sent when due."""
    click_hold: list[float]

    def __len__(self) -> int:
        return len(self.due)


class _Generator:
    """Draws the impressions of successive chunks of time (one rng: reproducible for a clock)."""

    def __init__(
        self,
        users: pa.Table,
        items: pa.Table,
        world: SyntheticWorld,
        config: Realtime,
        delay: ClickDelay,
        prefix: str,
    ) -> None:
        self.model = ClickModel(users, items, world)
        self.traffic = Traffic(self.model, world)
        self.config, self.delay, self.prefix = config, delay, prefix
        self.rng = np.random.default_rng([config.seed, 9])
        self.made = 0
        self.owed = 0.0

    def chunk(self, start: float) -> _Chunk:
        config, rng = self.config, self.rng
        self.owed += config.rate * config.chunk
        n = int(self.owed)
        self.owed -= n
        secs = start + np.sort(rng.random(n)) * config.chunk
        shown = self.traffic.draw(rng, secs)
        p_click = self.model.probability(
            shown.user_ids, shown.item_ids, shown.position, shown.device, secs
        )
        clicked = rng.random(n) < p_click
        delays, late = self.delay.draw(rng, n)
        broken = rng.random(n) < config.malformed_share
        hold_s = config.late_arrival.total_seconds()
        holds = np.where(
            rng.random((2, n)) < config.late_arrival_share, rng.uniform(0, hold_s, (2, n)), 0.0
        )
        ids = [f"{self.prefix}-{k:09d}" for k in range(self.made, self.made + n)]
        self.made += n
        return _Chunk(
            due=secs.tolist(),
            ids=ids,
            users=shown.user_ids.tolist(),
            items=shown.item_ids.tolist(),
            positions=shown.position.tolist(),
            devices=shown.device,
            p_click=p_click.tolist(),
            click_delay=np.where(clicked & ~broken, delays, np.nan).tolist(),
            late=late.tolist(),
            broken=broken.tolist(),
            hold=holds[0].tolist(),
            click_hold=holds[1].tolist(),
        )


_Pending = tuple[float, int, str, str, bytes, float, bool, bool]
"""A record waiting in the heap: (send at, sequence, kind, key, payload, event time, late
click, held back)."""


class _Run:
    """One real-time run: the heap of records not due yet (clicks, held-back records) and the
    counts."""

    def __init__(
        self, source: _Generator, send: Send, config: Realtime, report: StreamReport
    ) -> None:
        self.source, self.send, self.config, self.report = source, send, config, report
        self.pending: list[_Pending] = []
        self.sequence = counter()
        self.kinds = cycle(MALFORMED_KINDS)
        self.held_impressions = 0
        self.pending_clicks = 0

    def drawn(self) -> int:
        """Impressions sent or held back: what ``count`` limits."""
        return self.report.impressions + self.held_impressions

    def emit(self, kind: str, key: str, payload: bytes, late: bool, held: bool) -> None:
        self.send(kind, key, payload)
        report = self.report
        if kind == "clicks":
            report.clicks += 1
            report.late_clicks += late
            self.pending_clicks -= 1
        else:
            report.impressions += 1
            self.held_impressions -= held
        report.late_arrivals += held

    def impression(self, chunk: _Chunk, k: int, now: float, stamp: str) -> None:
        """Send (or hold back) impression ``k`` of ``chunk`` stamped ``now``; queue its click."""
        key, device = chunk.ids[k], chunk.devices[k]
        if chunk.broken[k]:
            record: dict[str, object] = {
                "impression_id": key,
                "user_id": chunk.users[k],
                "item_id": chunk.items[k],
                "ts": stamp,
                "position": chunk.positions[k],
                "device": device,
                "p_click": chunk.p_click[k],
            }
            broken_kind = next(self.kinds)
            self.report.malformed[broken_kind] += 1
            payload = _malformed(record, broken_kind, self.config.max_payload_bytes)
        else:
            payload = _IMPRESSION.format(
                key,
                chunk.users[k],
                chunk.items[k],
                stamp,
                chunk.positions[k],
                "null" if device is None else f'"{device}"',
                chunk.p_click[k],
            ).encode()
        hold = chunk.hold[k]
        if hold > 0:
            self.held_impressions += 1
            entry = (now + hold, next(self.sequence), "impressions", key, payload, now, False, True)
            heapq.heappush(self.pending, entry)
        else:
            self.emit("impressions", key, payload, False, False)
        delay_s = chunk.click_delay[k]
        if delay_s == delay_s:  # not NaN: a click, which happens ``delay_s`` after the impression
            due = now + delay_s
            click = _CLICK.format(key, _iso_s(due)).encode()
            late, hold = chunk.late[k], chunk.click_hold[k]
            self.pending_clicks += 1
            entry = (due + hold, next(self.sequence), "clicks", key, click, due, late, hold > 0)
            heapq.heappush(self.pending, entry)

    def due(self, now: float) -> None:
        while self.pending and self.pending[0][0] <= now:
            _, _, kind, key, payload, _, late, held = heapq.heappop(self.pending)
            self.emit(kind, key, payload, late, held)

    def stop(self, now: float) -> None:
        """What already happened goes out (records held back); clicks still to come do not."""
        for _, _, kind, key, payload, event_s, late, held in sorted(self.pending):
            if event_s <= now:
                self.emit(kind, key, payload, late, held)
        self.pending = []
        self.report.pending_clicks = self.pending_clicks

    def progress_line(self, behind: float) -> str:
        return (
            f"real time: {self.report.impressions:,} impressions and {self.report.clicks:,} "
            f"clicks sent, {self.pending_clicks:,} clicks pending; {max(behind, 0.0):.2f}s "
            "behind schedule"
        )


def stream_realtime(
    users: pa.Table,
    items: pa.Table,
    send: Send,
    config: Realtime,
    *,
    world: SyntheticWorld,
    delay: ClickDelay = DELAYS,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    progress: Callable[[str], None] = _quiet,
    id_prefix: str | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> StreamReport:
    """Send impressions at ``config.rate`` per second, stamped with the time they are sent,
    and each click when it comes due, until ``duration`` or ``count``, ``stop()`` or Ctrl-C.

    ``clock`` is the wall clock in seconds since the Unix epoch (event times come from it);
    ``sleep`` waits. Clicks not yet due when it stops are counted, not sent; records held back
    as late arrivals are sent before it returns. P(click) is the world's at the impression's
    scheduled time (within ``max_lag_s`` of the time it is stamped with). Impression ids start
    with ``id_prefix`` (default: the seed and the start time, so runs do not collide).
    """
    started = clock()
    prefix = id_prefix or f"rt{config.seed}-{int(started)}"
    source = _Generator(users, items, world, config, delay, prefix)
    report = StreamReport(delay=delay)
    run = _Run(source, send, config, report)
    end = started + config.duration if config.duration else math.inf
    limit = config.count or math.inf
    chunk, cursor, chunk_start = source.chunk(started), 0, started
    next_progress, behind = started + config.progress_every, 0.0
    try:
        while run.drawn() < limit:
            now = clock()
            if now >= end or stop():
                break
            stamp: str | None = None
            while run.drawn() < limit:
                if cursor == len(chunk):
                    if chunk_start + config.chunk > now:
                        break
                    chunk_start += config.chunk
                    chunk, cursor = source.chunk(chunk_start), 0
                    continue
                if chunk.due[cursor] > now:
                    break
                if stamp is None:  # one clock reading, one stamp, for what is due together
                    stamp = _iso_s(now)
                    behind = now - chunk.due[cursor]
                    report.max_lag_s = max(report.max_lag_s, behind)
                    report.first_ts = report.first_ts or datetime.fromtimestamp(now, UTC)
                    report.last_ts = datetime.fromtimestamp(now, UTC)
                run.impression(chunk, cursor, now, stamp)
                cursor += 1
            run.due(now)
            if now >= next_progress:
                next_progress = now + config.progress_every
                progress(run.progress_line(behind))
            wake = min(
                chunk.due[cursor] if cursor < len(chunk) else chunk_start + config.chunk,
                run.pending[0][0] if run.pending else math.inf,
                end,
                next_progress,
            )
            # At most a second at a time: a stop() is seen within one.
            sleep(min(max(wake - clock(), config.tick), 1.0))
        drain_until = min(end, clock()) + config.drain if config.drain > 0 else 0.0
        while run.pending and not stop() and clock() < drain_until:
            now = clock()
            run.due(now)
            if now >= next_progress:
                next_progress = now + config.progress_every
                progress(run.progress_line(0.0) + " (no new impressions: draining clicks)")
            wake = min(run.pending[0][0] if run.pending else drain_until, drain_until)
            sleep(min(max(wake - clock(), config.tick), 1.0))
    except KeyboardInterrupt:
        progress("interrupted: stopping the stream")
    stopped = clock()
    run.stop(stopped)
    report.seconds = stopped - started
    return report
