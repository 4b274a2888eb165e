"""Where a micro-batch's ``foreachBatch`` time goes, step by step, for the batch's metrics.

Spark's progress says how long the sink took (``addBatch``), not what it did. Each writer times
its own steps (:class:`StepClock`) and leaves them by batch id in a :data:`BatchSteps` map the
run's watch shares; spark_jobs.live.supervise adds what came before the writer's call and puts
them in the batch's metrics (``batch_<step>_ms``) and console line; ``flow bench freshness``
splits an impression's "jobs and commit" leg by them. The steps, in order:

* ``prepare``: Spark's, before the writer is called: the batch's physical plan made ready to
  run (its code generated, the broadcasts of dimension tables and vocabularies started). Not
  timed by the writer: ``addBatch`` less the writer's steps (:func:`with_prepare`);
* ``checks``: the writer's, before its job: a replay's test, the dimension tables' snapshots,
  the late threshold from the offset log, room in the channel (backpressure, retention);
* ``job``: the batch's Spark job(s), from the driver's call to their results (the broadcasts
  waited for, the stages);
* ``commit``: after the job: the counts, the pending ledger's file, the channel's commit.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["BEFORE_SINK", "STEPS", "BatchSteps", "StepClock", "step_metrics", "with_prepare"]

BEFORE_SINK = ("latestOffset", "walCommit", "getBatch", "queryPlanning")
"""A micro-batch's steps before its sink (Spark's ``durationMs`` keys), in the order they run:
its offsets fixed, its write-ahead log, its plan."""

STEPS = ("prepare", "checks", "job", "commit")
"""A batch's steps in its ``foreachBatch``, in the order they run."""

BatchSteps = dict[int, dict[str, float]]
"""Seconds per step, by batch id: filled by a writer, emptied by the watch that reports them."""


class StepClock:
    """A writer call's steps, timed back to back: :meth:`lap` ends the step it names, which
    began where the last one ended (or the clock was made)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last = clock()
        self.seconds: dict[str, float] = {}

    def lap(self, step: str) -> None:
        now = self._clock()
        self.seconds[step] = self.seconds.get(step, 0.0) + now - self._last
        self._last = now


def step_metrics(seconds: dict[str, float] | None) -> dict[str, float]:
    """A batch's steps as metrics (``batch_<step>_ms``), in :data:`STEPS`' order."""
    found = seconds or {}
    return {f"batch_{s}_ms": found[s] * 1000 for s in STEPS if s in found}


def with_prepare(seconds: dict[str, float], sink_ms: float) -> dict[str, float]:
    """A writer's steps with ``prepare`` before them: the sink's time (Spark's ``addBatch``,
    in ms) that the writer's call did not account for (never below 0: clocks differ)."""
    spent = sum(seconds.values())
    return {"prepare": max(sink_ms / 1000 - spent, 0.0), **seconds}
