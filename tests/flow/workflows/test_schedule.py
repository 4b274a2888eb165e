"""The scheduler: cron times, one run at a time, failures survived, every run logged."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from flow.errors import ConfigError
from flow.workflows.schedule import Cron, Scheduler, exclusive


class Clock:
    """A fake clock: sleeping and running jobs move it forward."""

    def __init__(self, start: datetime) -> None:
        self.moment = start

    def now(self) -> datetime:
        return self.moment

    def sleep(self, seconds: float) -> None:
        self.moment += timedelta(seconds=seconds)


def test_cron_expressions_match_the_minutes_they_name() -> None:
    cron = Cron.parse("*/15 3 * * 1-5")
    monday = datetime(2026, 11, 23, 3, 0)
    assert cron.matches(monday)
    assert not cron.matches(monday.replace(minute=5))
    assert not cron.matches(monday + timedelta(days=5))  # Saturday
    assert cron.next_after(monday) == monday.replace(minute=15)
    assert Cron.parse("0 0 * * 7").matches(datetime(2026, 11, 22))  # 7 is Sunday
    with pytest.raises(ConfigError, match="five fields"):
        Cron.parse("* * *")
    with pytest.raises(ConfigError, match="outside 0-23"):
        Cron.parse("0 25 * * *")


def test_runs_never_overlap_overruns_skip_and_failures_do_not_stop_it(tmp_path: Path) -> None:
    clock = Clock(datetime(2026, 11, 21, 10, 0, 30))
    durations = iter([150.0, 10.0, 10.0])  # the first run outlasts two fire times
    started: list[datetime] = []
    running = [False]

    def job() -> int:
        assert not running[0], "a run started while another was running"
        running[0] = True
        started.append(clock.now())
        clock.sleep(next(durations))
        running[0] = False
        if len(started) == 2:
            raise RuntimeError("the cluster is down")
        return 0

    log = tmp_path / "retrain.jsonl"
    made = Scheduler(Cron.parse("* * * * *"), job, log, now=clock.now, sleep=clock.sleep,
                     say=lambda _: None).run(max_runs=3)  # fmt: skip
    assert made == 3
    assert [t.strftime("%H:%M") for t in started] == ["10:01", "10:04", "10:05"]
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["skipped_while_running"] for e in entries] == [2, 0, 0]
    assert entries[1]["exit_code"] == -1
    assert "the cluster is down" in entries[1]["error"]


def test_the_lock_is_held_by_one_holder_at_a_time(tmp_path: Path) -> None:
    lock = tmp_path / "retrain.lock"
    with exclusive(lock) as first:
        assert first
        with exclusive(lock) as second:
            assert not second
    with exclusive(lock) as again:
        assert again
