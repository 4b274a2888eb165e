"""The scheduler: cron times, one run at a time, failures survived, every run logged."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from flow.errors import ConfigError
from flow.workflows.retrain import EXIT_CODES
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


def test_a_restricted_day_of_month_or_day_of_week_fires_whichever_comes_first() -> None:
    cron = Cron.parse("0 3 1 * 1")  # the 1st of the month, or a Monday
    fired = [cron.next_after(datetime(2026, 11, 21, 12, 0))]  # a Saturday
    for _ in range(3):
        fired.append(cron.next_after(fired[-1]))
    assert fired == [
        datetime(2026, 11, 23, 3, 0),  # Monday, not the 1st
        datetime(2026, 11, 30, 3, 0),  # Monday
        datetime(2026, 12, 1, 3, 0),  # Tuesday, the 1st
        datetime(2026, 12, 7, 3, 0),  # Monday
    ]
    assert cron.matches(datetime(2026, 12, 1, 3, 0))
    assert not cron.matches(datetime(2026, 12, 2, 3, 0))  # a Wednesday, not the 1st


def test_month_ends_and_leap_days() -> None:
    last = Cron.parse("0 0 31 * *")
    assert last.next_after(datetime(2026, 1, 31)) == datetime(2026, 3, 31)  # no 31 February
    assert last.next_after(datetime(2026, 3, 31)) == datetime(2026, 5, 31)  # nor 31 April
    leap = Cron.parse("0 0 29 2 *")
    assert leap.next_after(datetime(2026, 3, 1)) == datetime(2028, 2, 29)
    assert leap.next_after(datetime(2096, 3, 1)) == datetime(2104, 2, 29)  # 2100 is no leap year


def test_sunday_is_both_0_and_7() -> None:
    sunday, monday = datetime(2026, 11, 22), datetime(2026, 11, 23)
    for text in ("0 0 * * 0", "0 0 * * 7", "0 0 * * sun"):
        cron = Cron.parse(text)
        assert cron.matches(sunday)
        assert not cron.matches(monday)
        assert cron.next_after(monday) == datetime(2026, 11, 29)
    assert Cron.parse("0 0 * * 5-7").matches(sunday)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("0 3 * *", r"needs five fields .*e\.g\. \"0 3 \* \* \*\""),
        ("0 3 * * * 2027", "needs five fields"),
        ("0 25 * * *", r"the hour field '25' is outside 0-23; e\.g\. \"0 3 \* \* \*\""),
        ("61 * * * *", "the minute field '61' is outside 0-59"),
        ("0 0 32 * *", "the day-of-month field '32' is outside 1-31"),
        ("0 0 * 13 *", "the month field '13' is outside 1-12"),
        ("0 3 * * 8", r"the day-of-week field '8' is outside 0-7; e\.g\. .*0 and 7 are Sunday"),
        ("*/0 * * * *", "the minute field '\\*/0' is not a minute"),
        ("0 3 * * funday", "the day-of-week field 'funday' is not a day-of-week"),
        ("0 0 30 2 *", "never fires"),
    ],
)
def test_a_bad_expression_names_the_field_and_shows_an_example(
    expression: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        Cron.parse(expression)


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


def test_retrains_outcomes_are_logged_by_name_and_only_errors_as_failures(tmp_path: Path) -> None:
    clock = Clock(datetime(2026, 11, 21, 10, 0, 30))
    codes = iter([EXIT_CODES["kept"], EXIT_CODES["nothing-new"], 1, EXIT_CODES["promoted"]])
    said: list[str] = []
    log = tmp_path / "retrain.jsonl"
    outcomes = {code: outcome for outcome, code in EXIT_CODES.items()}
    Scheduler(Cron.parse("* * * * *"), lambda: next(codes), log, now=clock.now,
              sleep=clock.sleep, say=said.append, outcomes=outcomes).run(max_runs=4)  # fmt: skip
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["outcome"] for e in entries] == ["kept", "nothing-new", "failed", "promoted"]
    assert [line for line in said if "failed" in line] == [
        "run 3 failed (exit 1); the schedule goes on"
    ]
    assert len(set(EXIT_CODES.values())) == len(EXIT_CODES), "one exit code per outcome"
    assert 1 not in EXIT_CODES.values(), "1 is an error's"


def test_the_lock_is_held_by_one_holder_at_a_time(tmp_path: Path) -> None:
    lock = tmp_path / "retrain.lock"
    with exclusive(lock) as first:
        assert first
        with exclusive(lock) as second:
            assert not second
    with exclusive(lock) as again:
        assert again


def test_a_run_in_another_process_holds_the_lock_until_it_ends(tmp_path: Path) -> None:
    lock = tmp_path / "retrain.lock"
    with subprocess.Popen(
        [sys.executable, "-c", HOLD_THE_LOCK, str(lock)], stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "held"
            with exclusive(lock) as mine:
                assert not mine
        finally:
            holder.kill()  # even a killed holder lets go: the OS releases its lock
    with exclusive(lock) as mine:
        assert mine


HOLD_THE_LOCK = """
import sys, time
from pathlib import Path
from flow.workflows.schedule import exclusive
with exclusive(Path(sys.argv[1])) as mine:
    print("held" if mine else "busy", flush=True)
    time.sleep(300)
"""
