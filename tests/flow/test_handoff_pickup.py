"""Pick-ups and origins (flow.handoff.pickup) from given commits and times."""

from __future__ import annotations

import numpy as np

from flow.handoff import Commit, ShardInfo
from flow.handoff.pickup import PickUps
from flow.handoff.plan import Span


def commit(batch_id: int, rows: int, at: str = "2026-11-28T10:00:00+00:00") -> Commit:
    shard = ShardInfo(f"s{batch_id}", 0, rows, 1, "0")
    return Commit("live", batch_id, (shard,), "f", committed_at=at)


def test_a_pickup_keeps_the_first_poll_that_listed_its_commit() -> None:
    pickups = PickUps()
    first = pickups.add(commit(3, 10, "2026-11-28T10:00:00+00:00"), found_s=1_795_860_002.5)
    assert first.committed_s == 1_795_860_000.0
    assert first.waited_s == 2.5
    assert pickups.add(commit(3, 10), found_s=1_795_860_009.0) is first


def test_only_the_latest_commits_are_remembered() -> None:
    pickups = PickUps(kept=2)
    for batch_id in range(5):
        pickups.add(commit(batch_id, 1), found_s=float(batch_id))
    assert len(pickups) == 2
    assert pickups.get(2) is None
    assert pickups.get(4) is not None


def test_an_origin_counts_each_commits_rows_in_the_window_carried_ones_included() -> None:
    pickups = PickUps()
    for batch_id in (1, 2, 3):
        pickups.add(commit(batch_id, 100), found_s=float(batch_id))
    carried = np.array([[1, 0, 7], [1, 0, 8], [2, 0, 0]], dtype=np.int64)
    spans = [Span(2, 0, 10, 40), Span(3, 0, 0, 50), Span(9, 0, 0, 5)]  # 9: not remembered
    origin = pickups.origin(spans, carried, ready_s=12.0)
    assert [p.batch_id for p in origin.commits] == [1, 2, 3]
    assert origin.rows == (2, 31, 50)
    assert origin.ready_s == 12.0
