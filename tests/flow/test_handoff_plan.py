"""Property tests of the read plan: pure functions of commit metadata, a seed and a rank."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flow.errors import ConfigError
from flow.handoff.plan import (
    RankPlanner,
    RowTracker,
    ShardRef,
    World,
    assign,
    batch_sizes,
    keep_of,
    rank_totals,
)


@dataclass(frozen=True)
class Case:
    commits: list[list[ShardRef]]
    world_size: int
    batch_size: int
    window_rows: int
    seed: int
    epoch: int

    @property
    def rows(self) -> int:
        return sum(s.rows for c in self.commits for s in c)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    buckets = draw(st.sampled_from([1, 2, 4, 6, 8]))
    # Any world size, dividing the bucket count or not, more ranks than buckets too.
    world = draw(st.integers(1, 8))
    commits = []
    for k in range(draw(st.integers(1, 5))):
        shard_rows = draw(st.lists(st.integers(0, 150), min_size=0, max_size=6))
        commits.append(
            [
                ShardRef(
                    commit=100 + k, index=i, bucket=draw(st.integers(0, buckets - 1)), rows=rows
                )
                for i, rows in enumerate(shard_rows)
            ]
        )
    batch = draw(st.integers(2, 40))
    return Case(
        commits,
        world,
        batch,
        batch * draw(st.integers(1, 6)) + 1,
        draw(st.integers(0, 2**32 - 1)),
        draw(st.integers(0, 3)),
    )


def run(case: Case, rank: int, *, finite: bool) -> tuple[list[np.ndarray], RankPlanner]:
    totals = rank_totals(case.commits, case.world_size)
    planner = RankPlanner(
        rank,
        case.batch_size,
        case.window_rows,
        case.seed,
        case.epoch,
        sizes=batch_sizes(totals, rank, case.batch_size) if finite else None,
    )
    tracker = RowTracker()
    out: list[np.ndarray] = []
    for ordinal, commit in enumerate(case.commits):
        before = rank_totals(case.commits[:ordinal], case.world_size)
        spans = assign(commit, case.world_size, before=before, seed=case.seed, epoch=case.epoch)
        for window, batches in planner.add(spans[rank]):
            out.extend(tracker.window(window, batches))
    if not finite:
        for window, batches in planner.finish(totals):
            out.extend(tracker.window(window, batches))
    return out, planner


def keys(batches: list[np.ndarray]) -> list[tuple[int, int, int]]:
    return [(int(c), int(i), int(r)) for batch in batches for c, i, r in batch]


def committed(case: Case) -> Counter[tuple[int, int, int]]:
    return Counter(
        (s.commit, s.index, row) for c in case.commits for s in c for row in range(s.rows)
    )


@settings(max_examples=150, deadline=None)
@given(cases())
def test_a_finite_epoch_reads_every_row_once_in_equal_batch_counts(case: Case) -> None:
    runs = [run(case, r, finite=True) for r in range(case.world_size)]
    counts = {len(batches) for batches, _ in runs}
    assert len(counts) == 1, f"unequal batch counts per rank: {counts}"
    seen = Counter(k for batches, _ in runs for k in keys(batches))
    totals = rank_totals(case.commits, case.world_size)
    if min(totals) > 0:
        assert seen == committed(case)
    else:  # fewer rows than ranks: nobody yields, nothing is yielded twice
        assert not seen
    for batches, _ in runs:
        sizes = [len(b) for b in batches]
        assert all(s == case.batch_size for s in sizes[:-1])
        assert all(1 <= s <= case.batch_size + 1 for s in sizes[-1:])


@settings(max_examples=150, deadline=None)
@given(cases())
def test_a_followed_channel_keeps_ranks_equal_and_accounts_for_every_row(case: Case) -> None:
    runs = [run(case, r, finite=False) for r in range(case.world_size)]
    assert len({len(batches) for batches, _ in runs}) == 1
    seen = Counter(k for batches, _ in runs for k in keys(batches))
    assert all(v == 1 for v in seen.values()), "a row was yielded twice"
    undelivered = sum(planner.undelivered for _, planner in runs)
    assert sum(seen.values()) + undelivered == case.rows
    assert undelivered < case.world_size
    for batches, _ in runs:
        assert all(len(b) == case.batch_size for b in batches[:-1])


@settings(max_examples=150, deadline=None)
@given(cases())
def test_whole_commits_are_read_commit_by_commit_in_step_on_every_rank(case: Case) -> None:
    """Following with whole commits: after each commit every rank has yielded the same number
    of batches and the same number of rows, all of the commit's but at most one row a rank."""
    world = case.world_size
    planners = [
        RankPlanner(r, case.batch_size, case.window_rows, case.seed, case.epoch)
        for r in range(world)
    ]
    trackers = [RowTracker() for _ in range(world)]
    out: list[list[np.ndarray]] = [[] for _ in range(world)]
    for ordinal, commit in enumerate(case.commits):
        before = rank_totals(case.commits[:ordinal], world)
        after = rank_totals(case.commits[: ordinal + 1], world)
        spans = assign(commit, world, before=before, seed=case.seed, epoch=case.epoch)
        for rank in range(world):
            keep = keep_of(after, rank)
            assert keep in (0, 1)
            for window, plans in planners[rank].add(spans[rank], keep):
                out[rank].extend(trackers[rank].window(window, plans))
            assert planners[rank].carried == keep
        assert len({len(mine) for mine in out}) == 1, "ranks out of step"
        assert {sum(len(b) for b in mine) for mine in out} == {min(after)}
    for mine in out:
        assert all(1 <= len(b) <= case.batch_size for b in mine)
    seen = Counter(k for mine in out for k in keys(mine))
    assert all(v == 1 for v in seen.values()), "a row was yielded twice"
    left = sum(p.carried for p in planners)
    assert sum(seen.values()) + left == case.rows
    assert left < world


@settings(max_examples=60, deadline=None)
@given(cases(), st.integers(0, 7))
def test_the_plan_is_a_function_of_its_inputs(case: Case, rank_pick: int) -> None:
    rank = rank_pick % case.world_size
    first, _ = run(case, rank, finite=True)
    again, _ = run(case, rank, finite=True)
    assert keys(first) == keys(again)


def test_the_seed_and_the_epoch_change_the_order_but_not_the_rows() -> None:
    commit = [ShardRef(1, i, bucket=i % 4, rows=500) for i in range(8)]
    base = Case([commit], 2, 64, 1025, seed=1, epoch=0)
    orders = {}
    for seed, epoch in ((1, 0), (2, 0), (1, 1)):
        batches, _ = run(Case(base.commits, 2, 64, 1025, seed, epoch), 0, finite=True)
        orders[(seed, epoch)] = keys(batches)
    assert len({tuple(o) for o in orders.values()}) == 3
    assert len({frozenset(o) for o in orders.values()}) == 1


def test_windows_mix_rows_of_many_shards() -> None:
    commit = [ShardRef(1, i, bucket=0, rows=10_000) for i in range(16)]
    batches, _ = run(Case([commit], 1, 256, 256 * 16, seed=3, epoch=0), 0, finite=True)
    distinct = [len({int(s) for s in b[:, 1]}) for b in batches]
    # Shards far larger than the window: striping still draws each window from 8 shards.
    assert np.mean(distinct) > 7.5


def test_owners_keep_their_buckets_when_the_split_is_even() -> None:
    commit = [ShardRef(1, i, bucket=i % 4, rows=100) for i in range(8)]
    spans = assign(commit, 4, before=[0, 0, 0, 0], seed=0, epoch=0)
    for rank, mine in enumerate(spans):
        assert {commit[s.index].bucket for s in mine} == {rank}


def test_a_world_comes_from_torchruns_variables() -> None:
    assert World.from_env({"RANK": "3", "WORLD_SIZE": "4"}) == World(3, 4)
    with pytest.raises(ConfigError, match="rank 4 is not in a world of 4"):
        World(4, 4)
