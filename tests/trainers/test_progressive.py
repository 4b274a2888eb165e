"""Progressive figures per channel, per pass and per event-time window, with bounded memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainers.data import NO_TIME
from trainers.progressive import EventWindows, ProgressiveScores

HOUR_US = 3_600_000_000


def batch(n: int, seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (n,), generator=g).float()
    return torch.randn(n, generator=g) + labels, {"label": labels}


def test_rows_of_a_later_epoch_are_scored_apart_from_first_seen_ones() -> None:
    scores = ProgressiveScores()
    first, second = batch(64, 0), batch(32, 1)
    scores.add("live", *first)
    scores.add("live", *second, repeated=True)
    scores.flush()
    assert scores.by_pass["first_seen"].count == 64
    assert scores.by_pass["repeated"].count == 32
    assert scores.by_channel["live"].count == scores.overall.count == 96


def test_rows_fall_into_the_event_time_window_of_their_channel() -> None:
    scores = ProgressiveScores(window_s=3600)
    logits, tensors = batch(6, 2)
    times = np.array([0, 1, HOUR_US, HOUR_US + 5, NO_TIME, 3 * HOUR_US], dtype=np.int64)
    scores.add("live", logits, tensors, event_time_us=times)
    scores.add("backfill", *batch(4, 3), event_time_us=np.zeros(4, dtype=np.int64))
    scores.add("live", *batch(4, 4), event_time_us=np.zeros(4, dtype=np.int64), repeated=True)
    scores.flush()
    found = scores.windows.compute()
    assert {start: f["count"] for start, f in found["live"].items()} == {0: 2, 3600: 2, 10800: 1}
    assert found["backfill"][0]["count"] == 4  # per channel, and repeated rows in none
    assert scores.windows.left_out() == {"live": {"untimed": 1, "late": 0}}


def test_at_most_max_windows_are_open_and_late_rows_of_a_closed_one_are_counted() -> None:
    windows = ProgressiveScores(window_s=3600).windows
    windows.max_windows = 2
    scores = ProgressiveScores(window_s=3600)
    scores.windows = windows
    for hour in (0, 1, 2, 0):  # hour 0 is closed when hour 2 opens; its last rows come late
        logits, tensors = batch(10, hour)
        scores.add("c", logits, tensors, event_time_us=np.full(10, hour * HOUR_US))
        scores.flush()
    assert len(windows.open) == 2
    assert windows.left_out()["c"] == {"untimed": 0, "late": 10}
    found = windows.compute()["c"]
    assert sorted(found) == [0, 3600, 7200]
    assert found[0]["count"] == 10  # its figures were kept when it closed


def test_batches_without_weights_weigh_one_beside_weighted_ones() -> None:
    scores = ProgressiveScores()
    logits, tensors = batch(8, 5)
    scores.add("c", logits, tensors)
    scores.add("c", logits, {**tensors, "weight": torch.full((8,), 3.0)})
    scores.flush()
    assert scores.overall.model.compute()["count"] == 16
    plain = ProgressiveScores()
    for _ in range(4):
        plain.add("c", logits, tensors)
    plain.flush()
    for key in ("logloss", "positive_rate", "calibration"):
        assert scores.overall.compute()[key] == pytest.approx(plain.overall.compute()[key])


def test_window_width_zero_keeps_no_windows() -> None:
    windows = EventWindows(0.0)
    assert not windows.enabled
    scores = ProgressiveScores(window_s=0.0)
    scores.add("c", *batch(5, 6), event_time_us=np.zeros(5, dtype=np.int64))
    scores.flush()
    assert scores.windows.compute() == {}
