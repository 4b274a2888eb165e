"""flow bench freshness's breakdown by leg (benchmarks/freshness.py), from given figures."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

STAGE = {
    "waiting": {"p50": 4.0, "p99": 9.0},
    "planning": {"p50": 1.0, "p99": 2.0},
    "jobs_and_commit": {"p50": 5.0, "p99": 8.0},
}


@pytest.fixture
def bench(benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark("freshness")


def test_the_trainers_legs_are_measured_beside_the_difference_of_quantiles(
    bench: ModuleType,
) -> None:
    # One commit of 900 rows waited 1 s for the follower, one of 100 rows 3 s.
    trainer = {
        "commits": [[7, 900, 1.0], [8, 100, 3.0]],
        "batches": [[6.0, 0.5], [8.0, 0.5], [10.0, 1.5]],
    }
    legs = bench.legs_of(STAGE, {"p50": 10.0, "p99": 19.0}, {"p50": 18.0, "p99": 17.0}, trainer)
    assert legs["waiting"] == STAGE["waiting"]
    assert legs["committed_to_picked_up"]["p50"] == 1.0  # per row: most rows waited 1 s
    assert legs["committed_to_picked_up"]["max"] == 3.0
    assert legs["picked_up_to_trained"]["p50"] == 8.0
    assert legs["ready_to_trained"]["p50"] == 0.5
    # The old figure stays, labelled: p99's difference of quantiles is negative.
    assert legs["committed_to_trained"] == {"p50": 8.0, "p99": -2.0}

    lines = bench.leg_lines(legs)
    assert lines[0].strip().startswith("[bold]produced -> trained by leg")
    said = "\n".join(lines)
    assert "committed -> picked up (poll, listing)" in said
    picked = next(line for line in lines if "picked up -> trained" in line)
    assert picked.endswith("8.0 / 10.0")  # p99 of 6, 8, 10: 9.96
    assert "a difference of quantiles" in lines[-1]


def test_without_the_trainers_file_only_the_stages_legs_and_the_difference_remain(
    bench: ModuleType,
) -> None:
    legs = bench.legs_of(STAGE, {"p50": 10.0}, {"p50": 12.0, "p99": None}, None)
    assert set(legs) == {*STAGE, "committed_to_trained"}
    assert legs["committed_to_trained"] == {"p50": 2.0}
    assert bench.leg_lines({}) == []


def test_compare_prints_both_designs_leg_by_leg_and_the_command_keeps_the_switch(
    bench: ModuleType,
) -> None:
    before = {"breakdown": STAGE, "freshness": {"produced_to_trained": {"p50": 9.5, "p99": 25.5}}}
    after = {
        "breakdown": {"waiting": {"p50": 1.0, "p99": 3.0}},
        "freshness": {"produced_to_trained": {"p50": 2.5, "p99": 8.0}},
    }
    lines = bench.compared(before, after)
    waiting = next(line for line in lines if "waiting for the micro-batch" in line)
    assert waiting.split()[-6:] == ["4.0", "/", "9.0", "1.0", "/", "3.0"]
    planning = next(line for line in lines if "planning" in line)
    assert planning.rstrip().endswith("n/a / n/a")  # the after run had no such leg
    assert lines[-1].split()[-6:] == ["9.5", "/", "25.5", "2.5", "/", "8.0"]
    command = bench._command({"seconds": 300.0, "trigger": "0 seconds", "full_batches": True})
    assert command == "flow bench freshness --seconds 300 --trigger '0 seconds' --full-batches"
    assert "--full-batches" not in bench._command({"full_batches": False})


def test_the_settled_quantiles_leave_out_the_first_minute_only(bench: ModuleType) -> None:
    catching_up = [[float(at), 40.0] for at in range(0, 60, 5)]
    running = [[float(at), 5.0 + (at % 7)] for at in range(60, 900, 5)]
    found = bench.settled(catching_up + running)
    assert found["p50"] == pytest.approx(8.0)
    assert found["p99"] == pytest.approx(11.0)
    assert bench.settled(catching_up) == {}  # a run shorter than a minute has no such figure
