"""What flow bench soak reports (benchmarks/_soak_report.py): windows, targets and checks."""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from rich.console import Console

MB = 2**20
POSITIVES = "positives at most once, after their impression"


@pytest.fixture
def report(benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark("_soak_report")


def batches(
    n: int, ms: Any = lambda i: 1000.0, heap: Any = lambda i: 500 * MB
) -> list[dict[str, Any]]:
    """``n`` samples a second apart; a collection every other batch."""
    return [
        {
            "index": i,
            "batch": i,
            "wall_time": 1000.0 + i,
            "duration_ms": ms(i),
            "heap_used": heap(i) + 100 * MB,
            "heap_after_gc": heap(i) if i % 2 == 0 else None,
            "python_rss": 250 * MB,
            "log_bytes": 40_000,
        }
        for i in range(n)
    ]


def test_each_batch_gets_the_idle_looks_since_the_sample_before_it(report: ModuleType) -> None:
    samples = batches(3)
    samples[2]["wall_time"] = samples[1]["wall_time"]  # read in the same progress poll
    polls = [
        [999.5, 0.001, 2, 1, 10 * MB],  # before the first sample
        [1000.5, 0.003, 2, 1, 11 * MB],
        [1000.6, 0.009, 2, 1, 12 * MB],
        [1000.7, 0.500, 40, 0, 13 * MB],  # not idle: it read a commit
    ]
    report.attach_polls(samples, polls)
    assert samples[0]["idle_poll_s"] == 0.001
    assert samples[1]["idle_poll_s"] == pytest.approx(0.006)  # the median of its two
    assert samples[1]["idle_poll_requests"] == 2
    assert samples[1]["follower_rss"] == 12 * MB
    assert samples[2]["idle_poll_s"] == samples[1]["idle_poll_s"]
    later = batches(1)
    later[0]["wall_time"] = 2000.0
    report.attach_polls(later, [])
    assert later[0]["idle_poll_s"] is None


def test_the_first_tenth_is_compared_with_the_last_of_the_steady_run(report: ModuleType) -> None:
    # 100 batches while the stream ran, then 5 slow ones catching up: left out.
    run = batches(105, ms=lambda i: 1000.0 if i < 50 else 1100.0 if i < 100 else 9000.0)
    summary = report.summarize(run, steady=100)
    assert summary["window"] == 10
    batch = summary["measures"]["batch_ms"]
    assert (batch["first"], batch["last"], batch["ratio"]) == (1000.0, 1100.0, pytest.approx(1.1))
    assert summary["targets"]["batch_ms"]["met"]
    assert summary["measures"]["heap_after_gc_mb"]["first"] == 500.0
    assert summary["measures"]["heap_after_gc_mb"]["growth_per_1000"] == pytest.approx(0.0)
    # No look of the follower was recorded: its targets are not met, not assumed.
    assert not summary["targets"]["idle_poll_ms"]["met"]


def test_growth_misses_the_targets_and_is_reported_per_1000_batches(report: ModuleType) -> None:
    run = batches(200, ms=lambda i: 1000.0 + 10 * i, heap=lambda i: (500 + i) * MB)
    summary = report.summarize(run, steady=200)
    assert not summary["targets"]["batch_ms"]["met"]
    # The medians of batches 0-19 and 180-199.
    assert summary["targets"]["batch_ms"]["ratio"] == pytest.approx(2895 / 1095)
    assert not summary["targets"]["heap_after_gc_mb"]["met"]
    assert summary["measures"]["heap_after_gc_mb"]["growth_per_1000"] == pytest.approx(1000.0)


def result_of_a_good_run() -> dict[str, Any]:
    return {
        "stream": {"impressions": 1000, "malformed": 10, "clicks": 60, "valid_impressions": 990},
        "stage": {
            "events_input": 1000,
            "events_dead": 10,
            "labels_input": 60,
            "duplicates": 0,
            "training_rows": 1050,
            "positives": 60,
            "reconciled": True,
        },
        "caught_up": True,
        "follower": {
            "rows": 1050,
            "negatives": {"1": 990},
            "positives": {"1": 60},
            "largest_number": 999,
            "positives_without_negative": 0,
            "prefixes": ["rt11-1"],
        },
        "checkpoint": {
            "exists": True,
            "commits": 30,
            "folded": 28,
            "segments": 4,
            "retired_upto": 25,
            "retired_not_folded": 0,
            "retired_records_left": 0,
            "retired_shard_folders_left": 0,
            "records_left": 4,
            "committed_rows": 1050,
        },
    }


@pytest.mark.parametrize(
    ("change", "failed"),
    [
        ({}, set()),
        ({"follower": {"negatives": {"1": 988, "2": 2}}}, {"every impression once"}),
        ({"follower": {"positives_without_negative": 1}}, {POSITIVES}),
        ({"follower": {"rows": 1049}}, {"counts reconcile"}),
        ({"caught_up": False}, {"counts reconcile"}),
        ({"checkpoint": {"retired_records_left": 3}}, {"log compacted"}),
        ({"checkpoint": {"retired_upto": -1}}, {"log compacted"}),
    ],
)
def test_checks_fail_on_what_breaks_them(
    report: ModuleType, change: dict[str, Any], failed: set[str]
) -> None:
    result = copy.deepcopy(result_of_a_good_run())
    for key, value in change.items():
        if isinstance(value, dict):
            result[key].update(value)
        else:
            result[key] = value
    found = report.checks(result)
    assert {name for name, check in found.items() if not check["ok"]} == failed


def test_the_table_and_the_plot_show_a_summarized_run(report: ModuleType, tmp_path: Path) -> None:
    run = batches(40)
    report.attach_polls(run, [[1000.0 + i + 0.5, 0.0003, 2, 1, 100 * MB] for i in range(40)])
    result = {
        **result_of_a_good_run(),
        "config": {"rate": 50.0, "trigger": "1 second"},
        "seconds": 200.0,
        "batches": run,
        "command": "flow bench soak --batches 40",
    }
    result["summary"] = report.summarize(run, steady=40)
    result["checks"] = report.checks(result)
    json.dumps(result)  # the JSON written is plain
    text = io.StringIO()
    report.show(result, Console(file=text, width=200))
    shown = text.getvalue()
    assert "batch_ms" in shown
    assert "requests per idle poll: at most 2.00 (target <= 2: met)" in shown
    assert "check every impression once: ok" in shown
    assert report.plot(result, tmp_path / "soak.png").stat().st_size > 10_000
