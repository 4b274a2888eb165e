"""``flow schedule PIPELINE.py --cron "..."``: retraining on a schedule, one run at a time.

A run starts at each time the cron expression matches (minute hour day-of-month month
day-of-week, local time). Runs never overlap: the loop waits for a run to end, and fire times
that passed meanwhile are skipped (logged), not queued. A failed run is logged and the schedule
goes on. Every run is a line of JSON in ``$FLOW_HOME/schedule/<name>.jsonl``.

Teams with a scheduler of their own run ``flow retrain`` from it instead (docs/scheduling.md):
``flow retrain`` holds a lock per pipeline, so even their overlapping triggers run one at a time.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from flow.errors import ConfigError

__all__ = ["Cron", "Scheduler", "exclusive"]

# Weekday 0 and 7 are both Sunday, as in crontab(5).
_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day", 1, 31), ("month", 1, 12), ("weekday", 0, 7))


def _field(text: str, name: str, low: int, high: int) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        base, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if base == "*":
            start, stop = low, high
        elif "-" in base:
            start, stop = (int(v) for v in base.split("-", 1))
        else:
            start = stop = int(base)
        if not (low <= start <= stop <= high) or step < 1:
            raise ConfigError(f"cron {name} {part!r} is outside {low}-{high}")
        values.update(range(start, stop + 1, step))
    return frozenset(v % 7 for v in values) if name == "weekday" else frozenset(values)


@dataclass(frozen=True)
class Cron:
    """A five-field cron expression: ``*/30 * * * *``, ``0 3 * * 1-5``, ``15 2,14 * * *``."""

    expression: str
    minute: frozenset[int]
    hour: frozenset[int]
    day: frozenset[int]
    month: frozenset[int]
    weekday: frozenset[int]

    @classmethod
    def parse(cls, expression: str) -> Cron:
        parts = expression.split()
        if len(parts) != 5:
            raise ConfigError(
                f"cron {expression!r} needs five fields (minute hour day month weekday), "
                'e.g. "0 3 * * *" for 03:00 every day'
            )
        try:
            fields = [_field(p, *spec) for p, spec in zip(parts, _FIELDS, strict=True)]
        except ValueError as exc:
            raise ConfigError(f"cron {expression!r}: {exc}") from None
        return cls(expression, *fields)

    def matches(self, moment: datetime) -> bool:
        weekday = (moment.weekday() + 1) % 7  # cron: 0 is Sunday
        return (
            moment.minute in self.minute
            and moment.hour in self.hour
            and moment.day in self.day
            and moment.month in self.month
            and weekday in self.weekday
        )

    def next_after(self, moment: datetime) -> datetime:
        """The first matching minute strictly after ``moment``."""
        candidate = moment.replace(second=0, microsecond=0) + timedelta(minutes=1)
        for _ in range(366 * 24 * 60):
            if self.matches(candidate):
                return candidate
            candidate += timedelta(minutes=1)
        raise ConfigError(f"cron {self.expression!r} never matches within a year")


@contextmanager
def exclusive(lock: Path) -> Iterator[bool]:
    """Whether this process holds ``lock`` (an flock, released when the process ends)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class Scheduler:
    """Runs ``job`` at the cron's times, one run at a time, logging each."""

    def __init__(
        self,
        cron: Cron,
        job: Callable[[], int],
        log: Path,
        *,
        now: Callable[[], datetime] = datetime.now,
        sleep: Callable[[float], None] = time.sleep,
        say: Callable[[str], None] = print,
    ) -> None:
        self.cron, self.job, self.log = cron, job, log
        self.now, self.sleep, self.say = now, sleep, say

    def _record(self, entry: dict[str, object]) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("a") as out:
            out.write(json.dumps(entry) + "\n")

    def run(self, max_runs: int | None = None) -> int:
        """Run until ``max_runs`` runs have been made (forever when None); the runs made."""
        made = 0
        due = self.cron.next_after(self.now())
        while max_runs is None or made < max_runs:
            wait = (due - self.now()).total_seconds()
            if wait > 0:
                self.say(f"next run at {due:%Y-%m-%d %H:%M}")
                self.sleep(wait)
            started = self.now()
            self.say(f"run {made + 1} starts ({self.cron.expression})")
            try:
                code = self.job()
                error = None
            except Exception as exc:  # a failed run is logged; the schedule goes on
                code, error = -1, f"{type(exc).__name__}: {exc}"
            ended = self.now()
            made += 1
            following = self.cron.next_after(ended)
            skipped = 0
            probe = self.cron.next_after(due)
            while probe < following:  # fire times that passed while this run was going
                skipped += 1
                probe = self.cron.next_after(probe)
            self._record(
                {
                    "due": due.isoformat(),
                    "started": started.isoformat(),
                    "ended": ended.isoformat(),
                    "exit_code": code,
                    "error": error,
                    "skipped_while_running": skipped,
                }
            )
            if code:
                self.say(f"run {made} failed ({error or f'exit {code}'}); the schedule goes on")
            if skipped:
                self.say(f"run {made} overran {skipped} fire time(s); they are skipped, not queued")
            due = following
        return made
