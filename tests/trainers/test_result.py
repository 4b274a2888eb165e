"""The trainer's legs of freshness (trainers.result), from given pick-ups and times."""

from __future__ import annotations

import json

import pytest

from flow.handoff import Origin, PickUp
from trainers.result import (
    TrainResult,
    final_metrics,
    freshness_legs,
    leg_quantile,
    summary_lines,
    trainer_legs,
)


def pickup(batch_id: int, committed_s: float, found_s: float, rows: int = 100) -> PickUp:
    return PickUp(batch_id, rows, committed_s, found_s)


def test_a_batch_is_picked_up_when_its_windows_rows_were_on_average() -> None:
    # Three quarters of the window from commit 1 (found at 10), a quarter from 2 (found at 20).
    origin = Origin((pickup(1, 5.0, 10.0), pickup(2, 18.0, 20.0)), (300, 100), ready_s=21.0)
    assert trainer_legs(origin, trained_s=25.0) == pytest.approx((12.5, 4.0))


def test_a_window_of_no_known_commit_has_no_legs() -> None:
    assert trainer_legs(Origin((), (), ready_s=1.0), trained_s=2.0) is None


def test_weighted_quantiles_count_each_value_by_its_weight() -> None:
    assert leg_quantile([], 0.5) is None
    assert leg_quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    # One commit of 900 rows waited 1 s, one of 100 rows 9 s: most rows waited 1 s.
    assert leg_quantile([9.0, 1.0], 0.5, [100, 900]) == 1.0
    assert leg_quantile([9.0, 1.0], 0.99, [100, 900]) == 9.0


def test_a_result_keeps_each_batchs_legs_and_each_commits_pickup_once() -> None:
    result = TrainResult()
    first = Origin((pickup(1, 0.0, 2.0, rows=900),), (900,), ready_s=3.0)
    both = Origin((pickup(1, 0.0, 2.0, rows=900), pickup(2, 4.0, 5.0)), (100, 100), ready_s=6.0)
    result.add_origin("live", first, trained_s=4.0)
    result.add_origin("live", first, trained_s=4.5)
    result.add_origin("live", both, trained_s=7.0)
    assert result.picked_up_to_trained_s["live"] == [2.0, 2.5, pytest.approx(3.5)]
    assert result.ready_to_trained_s["live"] == [1.0, 1.5, 1.0]
    assert result.committed_to_picked_up_s["live"] == {1: (900, 2.0), 2: (100, 1.0)}
    assert result.leg("committed_to_picked_up", 0.5, "live") == 2.0  # by rows: commit 1's
    assert result.leg("picked_up_to_trained", 0.5, "live") == 2.5
    assert result.leg("ready_to_trained", 0.5, "live") is not None
    assert result.leg("picked_up_to_trained", 0.5, "backfill") is None

    metrics = final_metrics(result)
    assert metrics["committed_to_picked_up_p50_s.live"] == 2.0
    assert metrics["picked_up_to_trained_p50_s.live"] == 2.5
    assert "ready_to_trained_p99_s.live" in metrics
    logged = json.loads(json.dumps(freshness_legs(result)))
    assert logged["live"]["commits"] == [[1, 900, 2.0], [2, 100, 1.0]]
    assert logged["live"]["batches"] == [[2.0, 1.0], [2.5, 1.5], [3.5, 1.0]]
    line = summary_lines(result)[-1]
    assert line.startswith("freshness by leg, channel live: committed -> picked up p50 2.0 s")
    assert "picked up -> trained p50 2.5 s" in line
