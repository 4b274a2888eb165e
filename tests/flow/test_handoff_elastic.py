"""Property tests of elastic resume in the plan: a world stopped anywhere, another finishing.

``walk`` is the reader's walk of one rank in pure terms (the batches' row references, and the
cursor after each); the tests stop a world of N ranks at random batches, re-cut what it left
for M ranks (and again for K) and count every committed row.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flow.errors import ConfigError
from flow.handoff.elastic import (
    OldPlan,
    Remainder,
    Stop,
    pieces_of,
    remainder,
    rows_of,
    share,
    start,
)
from flow.handoff.plan import (
    BatchPlan,
    RankPlanner,
    RowTracker,
    ShardRef,
    Window,
    batch_sizes,
    span_refs,
    targets,
)

Commits = list[tuple[int, list[ShardRef]]]


@dataclass(frozen=True)
class Setup:
    commits: Commits
    batch_size: int
    window_rows: int
    seed: int
    epoch: int
    finite: bool

    def ids(self) -> list[int]:
        return [c for c, _ in self.commits]

    def shards(self, commit: int) -> list[ShardRef]:
        return dict(self.commits)[commit]


@dataclass
class Walked:
    """One rank's walk: every batch's rows, the cursor before the first and after each batch,
    and the rows it could not deliver."""

    batches: list[np.ndarray]
    stops: list[Stop]
    undelivered: np.ndarray
    totals: list[int] | None


def totals_of(setup: Setup, rest: Remainder | None, world: int) -> list[int]:
    totals = start(rest, world)[0]
    for commit, shards in setup.commits:
        share_ = targets(rows_of(rest, commit, shards), totals)
        totals = [t + s for t, s in zip(totals, share_, strict=True)]
    return totals


def walk(setup: Setup, rest: Remainder | None, world: int, rank: int) -> Walked:
    """What ``flow.handoff.reader`` does for ``rank``, on row references instead of rows."""
    before, carries = start(rest, world)
    totals = totals_of(setup, rest, world) if setup.finite else None
    sizes = batch_sizes(totals, rank, setup.batch_size) if totals is not None else None
    planner = RankPlanner(
        rank, setup.batch_size, setup.window_rows, setup.seed, setup.epoch, sizes=sizes
    )
    planner.restore((0, 0, len(carries[rank])))
    tracker = RowTracker()
    tracker.carry = carries[rank]
    batches: list[np.ndarray] = []
    stops = [Stop(-1, list(before), planner.counters(), 0, tracker.carry, 0)]
    mark: tuple[int, list[int], tuple[int, int, int]] = (-1, list(before), planner.counters())

    def emit(windows: Iterator[tuple[Window, list[BatchPlan]]]) -> None:
        for window, plans in windows:
            carry = tracker.carry
            for plan, refs in zip(plans, tracker.window(window, plans), strict=True):
                batches.append(refs)
                stops.append(Stop(*mark, window.ident, carry, plan.ordinal + 1))

    after = -1
    for commit, shards in setup.commits:
        mark = (after, list(before), planner.counters())
        spans = share(
            rest, commit, shards, world, before=before, seed=setup.seed, epoch=setup.epoch
        )[rank]
        share_ = targets(rows_of(rest, commit, shards), before)
        before = [b + s for b, s in zip(before, share_, strict=True)]
        emit(planner.add(spans))
        after = commit
    emit(planner.drain() if setup.finite else planner.finish(before))
    return Walked(batches, stops, tracker.carry, totals)


def keys(refs: Sequence[np.ndarray]) -> Counter[tuple[int, int, int]]:
    return Counter((int(c), int(i), int(r)) for part in refs for c, i, r in part)


def committed(setup: Setup) -> Counter[tuple[int, int, int]]:
    return Counter(
        (s.commit, s.index, row) for _, c in setup.commits for s in c for row in range(s.rows)
    )


def left_rows(setup: Setup, rest: Remainder) -> Counter[tuple[int, int, int]]:
    """Every row the remainder names: its carried rows, its pieces, the commits left whole."""
    spans = [
        piece.span for commit, shards in setup.commits for piece in pieces_of(rest, commit, shards)
    ]
    return keys([rest.carry, span_refs(spans)])


@st.composite
def setups(draw: st.DrawFn) -> tuple[Setup, int, list[int]]:
    buckets = draw(st.sampled_from([2, 4, 6, 12]))
    worlds = [w for w in range(1, buckets + 1) if buckets % w == 0]
    commits: Commits = []
    for k in range(draw(st.integers(1, 5))):
        shard_rows = draw(st.lists(st.integers(0, 150), min_size=0, max_size=6))
        commits.append(
            (
                100 + 3 * k,  # batch ids need not follow each other
                [
                    ShardRef(100 + 3 * k, i, draw(st.integers(0, buckets - 1)), rows)
                    for i, rows in enumerate(shard_rows)
                ],
            )
        )
    batch = draw(st.integers(2, 30))
    setup = Setup(
        commits,
        batch,
        batch * draw(st.integers(1, 5)) + draw(st.integers(1, batch)),
        draw(st.integers(0, 2**32 - 1)),
        draw(st.integers(0, 3)),
        draw(st.booleans()),
    )
    return setup, buckets, draw(st.lists(st.sampled_from(worlds), min_size=3, max_size=3))


def stopped(
    data: st.DataObject, runs: list[Walked]
) -> tuple[list[Stop], Counter[tuple[int, int, int]]]:
    """Each rank stopped at a drawn batch (or before any): the cursors and the rows read."""
    stops, read = [], Counter[tuple[int, int, int]]()
    for run in runs:
        at = data.draw(st.integers(0, len(run.batches)))
        stops.append(run.stops[at])
        read += keys(run.batches[:at])
    return stops, read


def plan_of(setup: Setup, world: int, runs: list[Walked], rest: Remainder | None) -> OldPlan:
    totals = runs[0].totals
    return OldPlan(
        world,
        setup.batch_size,
        setup.window_rows,
        setup.seed,
        setup.epoch,
        shuffle=True,
        totals=totals,
        rest=rest,
    )


@settings(max_examples=300, deadline=None)
@given(setups(), st.data())
def test_a_world_stopped_anywhere_leaves_exactly_its_unread_rows_for_the_next_to_read_once(
    drawn: tuple[Setup, int, list[int]], data: st.DataObject
) -> None:
    setup, _, (n, m, k) = drawn
    everything = committed(setup)
    old = [walk(setup, None, n, r) for r in range(n)]
    stops, read = stopped(data, old)
    rest = remainder(plan_of(setup, n, old, None), stops, setup.ids(), setup.shards)
    # Consumed and left partition the epoch's rows (a followed channel's close may have left
    # rows no old rank could deliver: they are left too).
    assert read + left_rows(setup, rest) == everything

    new = [walk(setup, rest, m, q) for q in range(m)]
    assert len({len(run.batches) for run in new}) == 1, "ranks would wait for each other"
    again = keys([b for run in new for b in run.batches])
    undelivered = keys([run.undelivered for run in new])
    assert read + again + undelivered == everything, "a row read twice, or lost"
    if setup.finite and min(new[0].totals or [0]) > 0:
        assert not undelivered
    if not setup.finite:
        assert sum(undelivered.values()) < m
    sizes = sorted({len(b) for run in new for b in run.batches[:-1]})
    assert sizes in ([], [setup.batch_size])

    # Stopped again, in the resumed epoch, and re-cut for a third world.
    stops, read_again = stopped(data, new)
    rest2 = remainder(plan_of(setup, m, new, rest), stops, setup.ids(), setup.shards)
    assert read + read_again + left_rows(setup, rest2) == everything
    third = [walk(setup, rest2, k, q) for q in range(k)]
    last = keys([b for run in third for b in run.batches])
    undelivered = keys([run.undelivered for run in third])
    assert read + read_again + last + undelivered == everything


@settings(max_examples=100, deadline=None)
@given(setups(), st.data())
def test_ranks_that_read_the_whole_epoch_leave_nothing_of_it(
    drawn: tuple[Setup, int, list[int]], data: st.DataObject
) -> None:
    setup, _, (n, m, _) = drawn
    setup = replace(setup, finite=True)
    old = [walk(setup, None, n, r) for r in range(n)]
    done = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    stops, read = stopped(data, [run for run, d in zip(old, done, strict=True) if not d])
    stops.reverse()
    stops = [replace(old[r].stops[0], done=True) if d else stops.pop() for r, d in enumerate(done)]
    read += keys([b for run, d in zip(old, done, strict=True) if d for b in run.batches])
    rest = remainder(plan_of(setup, n, old, None), stops, setup.ids(), setup.shards)
    new = [walk(setup, rest, m, q) for q in range(m)]
    again = keys([b for run in new for b in run.batches])
    undelivered = keys([run.undelivered for run in new])
    everything = committed(setup)
    if min(old[0].totals or [0]) > 0:  # else the old world delivers nothing
        read_or_left = read + again + undelivered
        assert max(read_or_left.values(), default=1) == 1
        assert read_or_left == everything


def test_cursors_of_different_checkpoints_are_refused() -> None:
    commits = [(1, [ShardRef(1, i, i % 2, 100) for i in range(4)])]
    setup = Setup(commits, 10, 35, 0, 0, True)
    old = [walk(setup, None, 2, r) for r in range(2)]
    plan = plan_of(setup, 2, old, None)
    mixed = [old[0].stops[3], replace(old[1].stops[3], before=[5, 0])]
    with pytest.raises(ConfigError, match="disagrees with the others"):
        remainder(plan, mixed, setup.ids(), setup.shards)
    with pytest.raises(ConfigError, match="3 cursors for a world of 2"):
        remainder(plan, [*mixed, mixed[0]], setup.ids(), setup.shards)
