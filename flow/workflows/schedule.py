"""``flow schedule PIPELINE.py --cron "..."``: retraining on a schedule, one run at a time.

A run starts at each time the cron expression matches (minute hour day-of-month month
day-of-week, local time). Runs never overlap: the loop waits for a run to end, and fire times
that passed meanwhile are skipped (logged), not queued. A failed run is logged and the schedule
goes on. Every run is a line of JSON in ``$FLOW_HOME/schedule/<name>.jsonl``.

Cron expressions are read by ``croniter`` rather than by a parser of our own: cron's rules have
corners (a restricted day-of-month *or* day-of-week fires, not both; 7 is Sunday too; month
ends and leap days) that a maintained implementation already gets right.

Teams with a scheduler of their own run ``flow retrain`` from it instead (docs/scheduling.md):
``flow retrain`` holds a lock per pipeline, so even their overlapping triggers run one at a time.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from croniter import CroniterBadDateError, croniter
from filelock import FileLock, Timeout

from flow.errors import ConfigError

__all__ = ["Cron", "Scheduler", "exclusive"]

# Each field: its name, its range and an example of it, for messages about a bad one.
_FIELDS = (
    ("minute", 0, 59, '"*/15 * * * *" (every 15 minutes)'),
    ("hour", 0, 23, '"0 3 * * *" (03:00 every day)'),
    ("day-of-month", 1, 31, '"0 3 1,15 * *" (03:00 on the 1st and the 15th)'),
    ("month", 1, 12, '"0 3 1 */3 *" (03:00 on the first day of every quarter)'),
    ("day-of-week", 0, 7, '"0 3 * * 1-5" (03:00 Monday to Friday; 0 and 7 are Sunday)'),
)


def _bad_field(expression: str) -> str:
    """Which field of a rejected five-field expression is wrong, and how to write it."""
    parts = expression.split()
    for index, (name, low, high, example) in enumerate(_FIELDS):
        alone = " ".join(part if i == index else "*" for i, part in enumerate(parts))
        if croniter.is_valid(alone):
            continue
        # Numbers before a step ("/") or an nth-weekday ("#") are values of the field.
        values = (re.split("[/#]", item)[0] for item in parts[index].split(","))
        numbers = [int(n) for value in values for n in re.findall(r"\d+", value)]
        problem = (
            f"is outside {low}-{high}"
            if any(not low <= n <= high for n in numbers)
            else f"is not a {name} ({low}-{high}, a range a-b, a list a,b or a step */n)"
        )
        return f"the {name} field {parts[index]!r} {problem}; e.g. {example}"
    return 'e.g. "0 3 * * *" for 03:00 every day'


@dataclass(frozen=True)
class Cron:
    """A five-field cron expression: ``*/30 * * * *``, ``0 3 * * 1-5``, ``15 2,14 * * *``.

    As in crontab(5), when both day-of-month and day-of-week are restricted a day matching
    *either* fires: ``0 3 1 * 1`` runs on the 1st and on every Monday.
    """

    expression: str

    @classmethod
    def parse(cls, expression: str) -> Cron:
        """The expression, or a :class:`ConfigError` that names the bad field."""
        if len(expression.split()) != 5:
            # croniter also takes seconds and years (six or seven fields); crontab does not.
            raise ConfigError(
                f"cron {expression!r} needs five fields (minute hour day month weekday), "
                'e.g. "0 3 * * *" for 03:00 every day'
            )
        if not croniter.is_valid(expression):
            raise ConfigError(f"cron {expression!r}: {_bad_field(expression)}")
        cron = cls(expression)
        cron.next_after(datetime.now())  # "0 0 30 2 *" is valid field by field, yet never fires
        return cron

    def matches(self, moment: datetime) -> bool:
        """Whether the cron fires in the minute of ``moment``."""
        return bool(croniter.match(self.expression, moment))

    def next_after(self, moment: datetime) -> datetime:
        """The first matching minute strictly after ``moment``."""
        try:
            following: datetime = croniter(self.expression, moment).get_next(datetime)
        except CroniterBadDateError:
            raise ConfigError(
                f"cron {self.expression!r} never fires (no such date in the coming years); "
                "check the day-of-month and month fields"
            ) from None
        return following


@contextmanager
def exclusive(lock: Path) -> Iterator[bool]:
    """Whether this process got ``lock``; never waits (a busy pipeline's run is skipped).

    The lock is an OS file lock (``filelock``), so it is released when its holder ends, even by
    a crash: a stale lock file never blocks the next run.
    """
    held = FileLock(lock, blocking=False)
    try:
        held.acquire()
    except Timeout:
        yield False
        return
    try:
        yield True
    finally:
        held.release()


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
        outcomes: Mapping[int, str] | None = None,
    ) -> None:
        self.cron, self.job, self.log = cron, job, log
        self.now, self.sleep, self.say = now, sleep, say
        self.outcomes: Mapping[int, str] = outcomes or {0: "done"}
        """Exit codes that are not failures, by the outcome each means (``flow retrain``'s:
        flow.workflows.retrain.EXIT_CODES)."""

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
                    "outcome": self.outcomes.get(code, "failed"),
                    "error": error,
                    "skipped_while_running": skipped,
                }
            )
            if code in self.outcomes:
                self.say(f"run {made}: {self.outcomes[code]}")
            else:
                self.say(f"run {made} failed ({error or f'exit {code}'}); the schedule goes on")
            if skipped:
                self.say(f"run {made} overran {skipped} fire time(s); they are skipped, not queued")
            due = following
        return made
