"""The events the fault suite produces, and the fate each one must meet.

Every record carries a marker (a valid impression's id; ``marker`` in a broken one's JSON, or its
bytes, or its key) so that what comes out (training rows, dead letters) can be matched back to
what went in, record by record: lost = 0 and duplicated = 0 are checked, not inferred from totals.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from flow.config import KafkaConfig
from flow.stack.kafka import producer

MARKER = re.compile(rb"(bad-(?:imp|clk)-\d\d|late\d)")


def stamp(when: datetime) -> str:
    return when.astimezone(UTC).isoformat(sep=" ")


@dataclass
class Expected:
    """What the produced events must become."""

    labels: dict[str, float] = field(default_factory=dict)
    """Valid impression id -> the label its training row must have."""
    reasons: dict[str, str] = field(default_factory=dict)
    """Marker of a record that must be a dead letter -> a part of its reason."""
    duplicates: int = 0
    """Impressions sent again with the same id (to be dropped and counted, once each)."""
    pending: set[str] = field(default_factory=set)
    """Valid impressions whose window is still open when the suite ends."""
    impressions: int = 0
    """Impression records sent, of any kind."""
    clicks: int = 0


class Producer:
    """Sends the suite's events to ``<namespace>.impressions`` / ``.clicks``, noting their fate."""

    def __init__(self, kafka: KafkaConfig, namespace: str, base: datetime) -> None:
        self.out = producer(kafka)
        self.namespace = namespace
        self.base = base
        self.expected = Expected()
        self.next_id = 1
        self.latest = base
        """The latest event time sent so far."""

    def at(self, minutes: float) -> datetime:
        return self.base + timedelta(minutes=minutes)

    def _send(self, topic: str, value: bytes | None, key: bytes | None = None) -> None:
        self.out.produce(f"{self.namespace}.{topic}", value, key=key)
        if topic == "impressions":
            self.expected.impressions += 1
        else:
            self.expected.clicks += 1

    def _json(self, topic: str, record: dict[str, Any]) -> None:
        self._send(topic, json.dumps(record, default=stamp).encode())

    def flush(self) -> None:
        assert self.out.flush(30) == 0

    def impressions(
        self,
        count: int,
        *,
        clicks: bool,
        every: float = 0.25,
        repeat: Iterable[int] = (),
        per_second: float | None = None,
    ) -> datetime:
        """``count`` valid impressions, ``every`` minutes apart from a minute after the latest
        event sent so far; with ``clicks``, every third is clicked 2 minutes later (a positive)
        and every fifth other one 15 minutes later, after its 10-minute window (a negative).
        The ``repeat``-th ones (1-based) are sent twice: duplicates within the watermark.

        Records go out in event-time order, as a live producer sends them: a click is not sent
        before the events that happened before it, whose watermark it would otherwise pass.
        ``per_second``: paced in wall time to that many impressions a second (their clicks
        between them), else all at once. One call is one timeline: calls one after another
        each start a minute after the last click sent (up to 15 minutes after the last
        impression), so a stream of many small calls runs ahead of its clock."""
        start = self.latest + timedelta(minutes=1)
        twice = set(repeat)
        timeline: list[tuple[datetime, int, str, dict[str, Any]]] = []
        for k in range(count):
            n = self.next_id
            self.next_id += 1
            ident = f"v{n:04d}"
            ts = start + timedelta(minutes=k * every)
            record = {"id": ident, "user_id": n % 7, "ts": ts, "position": 1 + n % 9}
            record["device"] = "ios"
            timeline.append((ts, len(timeline), "impressions", record))
            if k + 1 in twice:
                timeline.append((ts, len(timeline), "impressions", dict(record)))
                self.expected.duplicates += 1
            label = 0.0
            if clicks and n % 3 == 0:
                when = ts + timedelta(minutes=2)
                timeline.append((when, len(timeline), "clicks", {"id": ident, "ts": when}))
                label = 1.0
            elif clicks and n % 5 == 0:
                when = ts + timedelta(minutes=15)
                timeline.append((when, len(timeline), "clicks", {"id": ident, "ts": when}))
            self.expected.labels[ident] = label
        began, sent = time.monotonic(), 0
        for ts, _, topic, record in sorted(timeline, key=lambda t: (t[0], t[1])):
            self._json(topic, record)
            self.latest = max(self.latest, ts)
            if per_second is not None and topic == "impressions":
                sent += 1
                ahead = began + sent / per_second - time.monotonic()
                if ahead > 0:
                    self.out.poll(0)  # serve delivery reports while waiting
                    time.sleep(ahead)
        self.flush()
        return start

    def late(self, markers: Iterable[str], at: datetime) -> None:
        """Valid impressions at ``at``: behind the watermark by the time they arrive.

        Spark's operators (and so the stage) call a record late when its event time is at or
        before the watermark of the micro-batch *before* the one reading it: send these only
        once a batch has closed windows later than ``at``."""
        for marker in markers:
            record = {"id": marker, "user_id": 1, "ts": at, "position": 1, "device": "web"}
            self._json("impressions", record)
            self.expected.reasons[marker] = "late: event time"
        self.flush()

    def pending(self, ident: str, when: datetime) -> None:
        """A valid impression at ``when`` (now), which stays in the join's state itself, and a
        click of an impression never sent (as live traffic has): the watermark is the smallest
        of the topics', so both must move for it to pass every earlier window."""
        self._json(
            "impressions", {"id": ident, "user_id": 1, "ts": when, "position": 1, "device": "web"}
        )
        self._json("clicks", {"id": f"{ident}-orphan", "ts": when})
        self.expected.pending.add(ident)
        self.flush()

    def broken(self, kinds: Iterable[str]) -> None:
        """One record of each of ``kinds`` (keys of :data:`BROKEN`)."""
        for kind in kinds:
            topic, build, reason = BROKEN[kind]
            value, key = build(self)
            self._send(topic, value, key)
            self.expected.reasons[kind] = reason
        self.flush()


def _record(marker: str, producer: Producer, **fields: Any) -> tuple[bytes, None]:
    base: dict[str, Any] = {
        "id": marker,
        "user_id": 1,
        "ts": producer.at(3),
        "position": 1,
        "device": "ios",
        "marker": marker,
    }
    base.update(fields)
    return json.dumps(
        {k: v for k, v in base.items() if v is not _DROP}, default=stamp
    ).encode(), None


_DROP = object()


def _raw(data: bytes) -> Any:
    return lambda p: (data, None)


BROKEN: dict[str, tuple[str, Any, str]] = {
    "bad-imp-01": ("impressions", _raw(b"bad-imp-01 \x00 not json at all"), "not a JSON object"),
    "bad-imp-02": ("impressions", _raw(b'["bad-imp-02", 1, 2]'), "not a JSON object"),
    "bad-imp-03": ("impressions", lambda p: (None, b"bad-imp-03"), "empty record (null value)"),
    "bad-imp-04": (
        "impressions",
        lambda p: _record("bad-imp-04", p, id=_DROP),
        "missing required field 'id'",
    ),
    "bad-imp-05": (
        "impressions",
        lambda p: _record("bad-imp-05", p, user_id=_DROP),
        "missing required field 'user_id'",
    ),
    "bad-imp-06": (
        "impressions",
        lambda p: _record("bad-imp-06", p, ts=_DROP),
        "missing required field 'ts'",
    ),
    "bad-imp-07": (
        "impressions",
        lambda p: _record("bad-imp-07", p, user_id="abc"),
        "field 'user_id' has value 'abc', which is not a long",
    ),
    "bad-imp-08": (
        "impressions",
        lambda p: _record("bad-imp-08", p, position=-1),
        "field 'position' = -1 is below the minimum 1",
    ),
    "bad-imp-09": (
        "impressions",
        lambda p: _record("bad-imp-09", p, position=999),
        "field 'position' = 999 is above the maximum 50",
    ),
    "bad-imp-10": (
        "impressions",
        lambda p: _record("bad-imp-10", p, device="toaster"),
        "is not one of ios, android, web",
    ),
    "bad-imp-11": (
        "impressions",
        lambda p: _record("bad-imp-11", p, pad="x" * 3000),
        "oversized record",
    ),
    "bad-imp-12": (
        "impressions",
        _raw(b'{"id":"bad-imp-12","user_id":1,"ts":"2026-01-01 00:00:00","device":"\xff\xfeios"}'),
        "not valid UTF-8",
    ),
    "bad-imp-13": (
        "impressions",
        lambda p: _record("bad-imp-13", p, ts=datetime(3000, 1, 1, tzinfo=UTC)),
        "event time in the future",
    ),
    "bad-imp-14": (
        "impressions",
        lambda p: _record("bad-imp-14", p, ts=datetime(1970, 1, 2, tzinfo=UTC)),
        "event time too old",
    ),
    "bad-imp-15": (
        "impressions",
        lambda p: _record("bad-imp-15", p, ts="yesterday"),
        "field 'ts' has value 'yesterday', which is not a timestamp",
    ),
    "bad-imp-16": ("impressions", _raw(b'{"id": "bad-imp-16", "ts": '), "not a JSON object"),
    "bad-imp-17": (
        "impressions",
        lambda p: _record("bad-imp-17", p, user_id=12.5),
        "field 'user_id' has value '12.5', which is not a long",
    ),
    "bad-clk-01": (
        "clicks",
        lambda p: (json.dumps({"marker": "bad-clk-01", "ts": stamp(p.at(4))}).encode(), None),
        "missing required field 'id'",
    ),
    "bad-clk-02": (
        "clicks",
        lambda p: (json.dumps({"id": "bad-clk-02", "ts": "soon"}).encode(), None),
        "field 'ts' has value 'soon', which is not a timestamp",
    ),
    "bad-clk-03": ("clicks", _raw(b"bad-clk-03 <xml/>"), "not a JSON object"),
}
"""Broken records: marker -> (topic, how to build it, a part of the reason it must carry)."""


def marker_of(raw: bytes | None, key: bytes | None) -> str | None:
    """The marker a dead letter carries, in its value or its key."""
    for data in (raw, key):
        if data:
            found = MARKER.search(data)
            if found:
                return found.group(1).decode()
    return None
