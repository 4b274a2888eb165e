"""The real-time stream, on a simulated clock: impressions stamped when sent, clicks sent when
due, late clicks at their share, malformed and held-back records, pending clicks reported."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from flow.errors import ConfigError
from flow.workflows.streaming import Realtime, StreamReport, stream_realtime
from flow.workflows.synthetic import ClickModel, SyntheticWorld

ANCHOR = datetime(2026, 1, 1, tzinfo=UTC)
WORLD = SyntheticWorld(seed=2, users=500, items=200, arrival_days=2, anchor=ANCHOR)
USERS, ITEMS = WORLD.users_table(), WORLD.items_table()


@dataclass
class Clock:
    """Wall time that moves only when slept: a run of hours takes a moment."""

    now: float = (ANCHOR + timedelta(days=1)).timestamp()
    sent: list[tuple[float, str, str, bytes]] = field(default_factory=list)
    interrupt_at: float | None = None

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.now += seconds
        if self.interrupt_at is not None and self.now >= self.interrupt_at:
            raise KeyboardInterrupt

    def send(self, kind: str, key: str, payload: bytes) -> None:
        self.sent.append((self.now, kind, key, payload))


def run(config: Realtime, clock: Clock | None = None) -> tuple[StreamReport, Clock]:
    clock = clock or Clock()
    report = stream_realtime(
        USERS, ITEMS, clock.send, config, world=WORLD, clock=clock.time, sleep=clock.sleep
    )
    return report, clock


def seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def test_impressions_are_stamped_when_sent_and_clicks_sent_when_due() -> None:
    started = Clock().now
    # Two and a half hours at 4 impressions/s: late clicks (36-90 minutes) come due too.
    config = Realtime(rate=4, duration=9000, chunk=30, tick=0.05, seed=3)
    report, clock = run(config)
    impressions = {}
    for at, kind, key, payload in clock.sent:
        record = json.loads(payload)
        assert record["impression_id"] == key
        if kind == "impressions":
            assert abs(seconds(record["ts"]) - at) < 0.002, "stamped with the time it is sent"
            impressions[key] = record
    assert len(impressions) == report.impressions == pytest.approx(4 * 9000, abs=4)
    assert report.first_ts is not None
    assert report.first_ts.timestamp() - started < 1.0
    delays = []
    for at, kind, key, payload in clock.sent:
        if kind == "clicks":
            click_ts = seconds(json.loads(payload)["ts"])
            assert click_ts <= at + 0.002 < click_ts + config.tick + 0.01, "sent when due"
            delays.append(click_ts - seconds(impressions[key]["ts"]))
    assert len(delays) == report.clicks > 0
    late = np.array(delays) > 30 * 60
    assert late.sum() == report.late_clicks > 0
    assert 0.01 < late.mean() < 0.08, "late clicks at about their share (4 %)"
    assert np.median(np.array(delays)[~late]) == pytest.approx(45 * np.log(2), rel=0.2)
    assert report.pending_clicks > 0, "the clicks of the last minutes were not due yet"
    assert report.max_lag_s <= config.tick + 1e-6
    assert report.delay.describe()["late_share"] == 0.04
    assert all(0 < r["p_click"] < 1 for r in impressions.values()), "each carries its p_click"


def test_p_click_is_the_world_s_at_the_time_sent() -> None:
    report, clock = run(Realtime(rate=50, duration=60, tick=0.02))
    records = [json.loads(p) for _, kind, _, p in clock.sent if kind == "impressions"]
    model = ClickModel(USERS, ITEMS, WORLD)
    truth = model.probability(
        np.array([r["user_id"] for r in records]),
        np.array([r["item_id"] for r in records]),
        np.array([r["position"] for r in records]),
        [r["device"] for r in records],
        np.array([seconds(r["ts"]) for r in records]),
    )
    np.testing.assert_allclose([r["p_click"] for r in records], truth, rtol=1e-4)
    assert len(records) == report.impressions


def test_malformed_and_held_back_records_and_a_count_limit() -> None:
    config = Realtime(
        rate=100, count=3000, malformed_share=0.05, late_arrival_share=0.05, seed=4, tick=0.02
    )
    report, clock = run(config)
    assert report.impressions == 3000
    assert set(report.malformed) == {
        "not_json",
        "missing_field",
        "wrong_type",
        "out_of_range",
        "oversized",
    }
    broken = 0
    newest = 0.0
    for _, kind, _, payload in clock.sent:
        try:
            record = json.loads(payload)
        except ValueError:
            broken += 1
            continue
        if kind == "impressions" and (
            "user_id" not in record
            or not isinstance(record["item_id"], int)
            or record["position"] < 1
            or len(payload) > config.max_payload_bytes
        ):
            broken += 1
            continue
        event = seconds(record["ts"])
        assert event >= newest - 180 - 0.01, "held back no longer than late_arrival"
        newest = max(newest, event)
    assert broken == sum(report.malformed.values())
    assert report.late_arrivals > 0


def test_ctrl_c_stops_it_with_a_report() -> None:
    clock = Clock()
    clock.interrupt_at = clock.now + 30
    report, _ = run(Realtime(rate=20, tick=0.05), clock)
    assert report.impressions == pytest.approx(600, abs=25)
    assert report.seconds == pytest.approx(30, abs=0.1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate": 0}, "Realtime.rate=0"),
        ({"duration": -1}, "Realtime.duration=-1"),
        ({"malformed_share": 1.0}, "Realtime.malformed_share=1.0"),
    ],
)
def test_bad_settings_name_the_field(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        Realtime(**kwargs)  # type: ignore[arg-type]


def test_draining_sends_the_clicks_of_the_last_impressions_and_no_new_impression() -> None:
    plain, _ = run(Realtime(rate=20, duration=120, tick=0.05, seed=4))
    drained, clock = run(Realtime(rate=20, duration=120, drain=300, tick=0.05, seed=4))
    assert drained.impressions == plain.impressions
    last_impression = max(at for at, kind, _, _ in clock.sent if kind == "impressions")
    assert any(at > last_impression + 60 for at, kind, _, _ in clock.sent if kind == "clicks")
    # Five minutes after the last impression only the late clicks (36-90 minutes) remain.
    assert drained.clicks > plain.clicks
    assert drained.pending_clicks < plain.pending_clicks
    assert drained.seconds == pytest.approx(420, abs=2)
