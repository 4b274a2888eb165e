"""A writer's steps timed back to back (spark_jobs.live.steps)."""

from __future__ import annotations

from collections.abc import Iterator

from spark_jobs.live.steps import STEPS, StepClock, step_metrics, with_prepare


def _ticks(*moments: float) -> Iterator[float]:
    yield from moments


def test_each_lap_ends_the_step_it_names_where_the_last_one_ended() -> None:
    ticks = _ticks(10.0, 10.5, 13.0, 13.25)
    clock = StepClock(lambda: next(ticks))
    for step in STEPS[1:]:  # the writer's: Spark's prepare comes before its call
        clock.lap(step)
    assert clock.seconds == {"checks": 0.5, "job": 2.5, "commit": 0.25}


def test_a_step_lapped_twice_adds_up() -> None:
    ticks = _ticks(0.0, 1.0, 1.5, 2.0)
    clock = StepClock(lambda: next(ticks))
    clock.lap("job")
    clock.lap("commit")
    clock.lap("job")
    assert clock.seconds == {"job": 1.5, "commit": 0.5}


def test_metrics_name_each_step_in_milliseconds_and_in_order() -> None:
    found = step_metrics({"commit": 0.25, "checks": 0.5})
    assert found == {"batch_checks_ms": 500.0, "batch_commit_ms": 250.0}
    assert list(found) == ["batch_checks_ms", "batch_commit_ms"]
    assert step_metrics(None) == {}


def test_prepare_is_the_sinks_time_the_writer_did_not_account_for() -> None:
    steps = with_prepare({"checks": 0.5, "job": 2.0, "commit": 0.25}, sink_ms=3250.0)
    assert steps == {"prepare": 0.5, "checks": 0.5, "job": 2.0, "commit": 0.25}
    assert list(steps) == list(STEPS)
    assert with_prepare({"job": 2.0}, sink_ms=1999.0)["prepare"] == 0.0  # clocks differ
