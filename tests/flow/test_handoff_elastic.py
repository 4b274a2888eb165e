"""Property tests of elastic resume in the plan: a world stopped anywhere, another finishing.

``walk`` is the reader's walk of one rank in pure terms (the batches' row references, and the
cursor after each); the tests stop a world of N ranks at random batches, re-cut what it left
for M ranks (and again for K) and count every committed row.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from flow.errors import ConfigError
from flow.handoff import ChannelReader, MixedReader, ReadOptions, World, every_rank
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
    keep_of,
    span_refs,
    targets,
)
from tests.support import Writer, read_ids

Commits = list[tuple[int, list[ShardRef]]]


@dataclass(frozen=True)
class Setup:
    commits: Commits
    batch_size: int
    window_rows: int
    seed: int
    epoch: int
    finite: bool
    whole: bool = False
    """Following with whole commits (ReadOptions.whole_commits)."""

    def keep(self, before: Sequence[int], rank: int) -> int | None:
        return keep_of(before, rank) if self.whole and not self.finite else None

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

    if rest is not None:  # a re-cut epoch begins with the rows its ranks carry
        emit(planner.drain(setup.keep(before, rank)))
    after = -1
    for commit, shards in setup.commits:
        mark = (after, list(before), planner.counters())
        spans = share(
            rest, commit, shards, world, before=before, seed=setup.seed, epoch=setup.epoch
        )[rank]
        share_ = targets(rows_of(rest, commit, shards), before)
        before = [b + s for b, s in zip(before, share_, strict=True)]
        emit(planner.add(spans, setup.keep(before, rank)))
        after = commit
    if not setup.finite and not setup.whole:
        emit(planner.finish(before))
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
    worlds = list(range(1, 9))  # any world size, dividing the buckets or not
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
        finite := draw(st.booleans()),
        whole=not finite and draw(st.booleans()),
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
        whole=setup.whole and not setup.finite,
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
    if setup.whole:  # a commit's last batch may be smaller
        assert all(1 <= s <= setup.batch_size for s in sizes)
    else:
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


# -- on real channels: readers of N ranks stopped, readers of M ranks finishing the epoch ------


def first(reader: ChannelReader, batches: int) -> list[list[int]]:
    return read_ids(reader, limit=batches) if batches else []


def stop_world(
    root: Path, size: int, options: ReadOptions, stops: Sequence[int]
) -> tuple[list[int], list[dict[str, Any]]]:
    """Readers of ``size`` ranks, rank r stopped after ``stops[r]`` batches: ids, cursors."""
    ids, cursors = [], []
    for rank in range(size):
        reader = ChannelReader(str(root), "c", world=World(rank, size), options=options)
        ids += [i for batch in first(reader, stops[rank]) for i in batch]
        cursors.append(reader.state_dict())
    return ids, cursors


def resume_world(
    root: Path, size: int, options: ReadOptions, cursors: list[dict[str, Any]]
) -> list[ChannelReader]:
    readers = []
    for rank in range(size):
        reader = ChannelReader(str(root), "c", world=World(rank, size), options=options)
        reader.load_state_dict(every_rank(cursors))
        readers.append(reader)
    return readers


def channel(root: Path, follow: bool, buckets: int = 6) -> list[int]:
    w = Writer(root, "c", buckets=buckets)
    written: list[int] = []
    commits = [[210, 90, 333, 41, 7, 120], [17], [400, 400, 12, 7], [64, 65, 3]]
    if buckets > 6:  # a shard in every bucket: owners of 22 and of 21 buckets (64 on 3 ranks)
        rng = np.random.default_rng(buckets)
        commits = [rng.integers(0, 40, buckets).tolist() for _ in range(3)] + [[5, 9]]
    for sizes in commits:
        written += w.commit(sizes)
    if follow:
        w.channel.close()
    return written


@pytest.mark.parametrize("follow", [False, True], ids=["finite", "following"])
@pytest.mark.parametrize(
    ("old", "new", "buckets"),
    # World sizes need not divide the bucket count: a shard's owner is bucket % world, and the
    # plan balances rows across ranks whatever each owns.
    [(2, 1, 6), (1, 3, 6), (3, 2, 6), (1, 3, 64), (3, 2, 64), (2, 6, 64), (5, 3, 64)],
)
def test_an_epoch_stopped_by_n_ranks_is_finished_by_m_ranks_every_row_once(
    tmp_path: Path, old: int, new: int, buckets: int, follow: bool
) -> None:
    written = channel(tmp_path, follow, buckets)
    options = ReadOptions(batch_size=32, window_rows=200, seed=3, follow=follow)
    read, cursors = stop_world(tmp_path, old, options, [11] * old)
    readers = resume_world(tmp_path, new, options, cursors)
    rest = [read_ids(reader) for reader in readers]
    if not follow:  # a finite epoch's ranks yield as many batches each
        assert len({len(batches) for batches in rest}) == 1
    again = [i for batches in rest for batch in batches for i in batch]
    undelivered = sum(reader.stats.undelivered for reader in readers)
    assert max(Counter(read + again).values()) == 1, "a row read twice"
    assert len(read) + len(again) + undelivered == len(written)
    if not follow:
        assert sorted(read + again) == written
    assert read
    assert again
    # The next epoch is the new world's own: every row once again.
    nxt = [i for reader in readers for batch in read_ids(reader) for i in batch]
    assert len(nxt) + sum(r.stats.undelivered for r in readers) == len(written)
    assert len(set(nxt)) == len(nxt)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    worlds=st.sampled_from([(2, 1, 3), (1, 3, 2), (3, 2, 6), (6, 1, 2)]),
    stops=st.lists(st.integers(0, 60), min_size=6, max_size=6),
    later=st.lists(st.integers(0, 30), min_size=6, max_size=6),
)
def test_a_re_cut_epoch_resumes_on_its_own_world_and_re_cuts_again(
    tmp_path_factory: pytest.TempPathFactory,
    worlds: tuple[int, int, int],
    stops: list[int],
    later: list[int],
) -> None:
    """Ranks stopped at different batches; the resumed world stopped, resumed by itself and
    by a third world: every row of the epoch once over the three."""
    root = tmp_path_factory.mktemp("recut")
    written = channel(root, follow=False)
    options = ReadOptions(batch_size=32, window_rows=200, seed=5)
    n, m, k = worlds
    read, cursors = stop_world(root, n, options, stops)
    assume(any(c["epoch"] == 0 for c in cursors))  # else the first world read it all
    readers = resume_world(root, m, options, cursors)
    middle, recut = [], []
    for rank, reader in enumerate(readers):
        middle += [i for batch in first(reader, later[rank]) for i in batch]
        recut.append(reader.state_dict())
        # The same world goes on from the cursor exactly as the reader itself does.
        again = ChannelReader(str(root), "c", world=World(rank, m), options=options)
        again.load_state_dict(recut[-1])
        assert read_ids(again) == read_ids(reader)
    last = [
        i for reader in resume_world(root, k, options, recut) for b in read_ids(reader) for i in b
    ]
    if all(c["epoch"] == 1 for c in recut):  # the second world finished the epoch
        assert sorted(read + middle) == written
        assert sorted(last) == written  # the third reads the next one, whole
    else:
        assert sorted(read + middle + last) == written


def test_cursors_of_another_channel_or_options_are_refused(tmp_path: Path) -> None:
    channel(tmp_path, follow=False)
    options = ReadOptions(batch_size=32, window_rows=200, seed=3)
    _, cursors = stop_world(tmp_path, 2, options, [4, 4])
    other = ChannelReader(str(tmp_path), "c", options=replace(options, seed=4))
    with pytest.raises(ConfigError, match="only the number of ranks may change"):
        other.load_state_dict(every_rank(cursors))
    ahead = ChannelReader(str(tmp_path), "c", world=World(1, 2), options=options)
    read_ids(ahead)
    first(ahead, 2)  # into the next epoch
    reader = ChannelReader(str(tmp_path), "c", options=options)
    with pytest.raises(ConfigError, match="rank 1's cursor is in epoch 1, another's in 0"):
        reader.load_state_dict(every_rank([cursors[0], ahead.state_dict()]))


def test_a_mix_of_channels_resumes_on_another_world_every_row_once(tmp_path: Path) -> None:
    written = {name: Writer(tmp_path, name, buckets=6) for name in ("a", "b")}
    written["b"].next_id = 10_000  # ids tell the channels apart
    ids = written["a"].commit([300, 200, 90]) + written["b"].commit([150, 250, 40, 7])
    options = ReadOptions(batch_size=16, window_rows=100, seed=2)

    def mix(rank: int, size: int) -> MixedReader:
        readers = {
            n: ChannelReader(str(tmp_path), n, world=World(rank, size), options=options)
            for n in written
        }
        return MixedReader(readers, weights={"a": 1.0, "b": 2.0}, seed=2)

    read, cursors = [], []
    for rank in range(2):
        old = mix(rank, 2)
        read += [i for batch in itertools.islice(old, 12) for i in batch.column("id").to_pylist()]
        cursors.append(old.state_dict())
    new = mix(0, 1)
    new.load_state_dict(every_rank(cursors))
    rest = [i for batch in new for i in batch.column("id").to_pylist()]
    assert sorted(read + rest) == ids
