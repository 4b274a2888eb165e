"""Reading a channel: one rank's batches, shuffled in windows, resumable, followable.

The reader executes the plan of :mod:`flow.handoff.plan` on data: it opens the shards a window
needs (read ahead by two threads, checksums verified), gathers the window's rows in their
permuted order once, and hands out zero-copy slices of it as Arrow record batches.

Its cursor is taken at the start of the window in progress: the commit being read, every
rank's row totals before it, the planner's counters when that commit began, and the references
of the rows carried into the window (fewer than a batch and a row). Resuming costs the span
arithmetic of one commit and one window's permutation, however long the channel, and never
needs commits that retention has already deleted.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa

from flow.errors import ConfigError
from flow.handoff.channel import Channel, ConsumerPosition
from flow.handoff.format import Commit
from flow.handoff.plan import (
    BatchPlan,
    RankPlanner,
    ShardRef,
    Span,
    Window,
    World,
    assign,
    batch_sizes,
    check_world,
    rank_totals,
    targets,
)
from flow.handoff.shards import read_shard
from flow.handoff.slices import WindowRows, WindowSlice, one_batch

__all__ = ["ChannelReader", "ReadOptions", "ReadStats"]


class _Rows(Protocol):
    @property
    def num_rows(self) -> int: ...


T = TypeVar("T", bound=_Rows)
"""What a reader yields: record batches, or window slices."""
_NO_REFS = np.empty((0, 3), dtype=np.int64)
_SAMPLE = 16  # one batch in this many is measured for shuffle quality


@dataclass(frozen=True)
class ReadOptions:
    """How a rank reads a channel."""

    batch_size: int = 4096
    window_rows: int | None = None
    """Rows permuted together (default 16 batches). Memory is bounded by this, not the data."""
    shuffle: bool = True
    seed: int = 0
    follow: bool = False
    """Keep reading new commits as they land; end when the channel is closed."""
    poll_interval: float = 0.05
    """Seconds between looks for new commits while following."""
    verify: bool = True
    """Check every shard's checksum (XXH3, ~15 GB/s) before reading it."""
    consumer_group: str | None = None
    """Record this rank's position under this name, for retention and backpressure."""
    record_every: float = 5.0
    prefetch: int = 2
    """Windows' worth of rows whose shards are opened (read, checked, decompressed) ahead of use
    by background threads; 0: none. Memory grows by up to this many windows of rows."""
    threads: int = 2
    """Threads that open shards ahead of use. pyarrow releases the GIL while it reads, checks
    and decompresses, so each thread can use a core: a GPU trainer reading millions of rows a
    second wants several (see docs/benchmarks.md, "The GPU path")."""
    after_commit: int = -1
    """Read only the commits after this batch id (e.g. what arrived since the last training)."""
    buckets: frozenset[int] | None = None
    """Read only these buckets (a held-out slice, say); None: all of them. Every rank of a world
    gets an equal share of the chosen buckets' rows, as with all of them."""

    def __post_init__(self) -> None:
        if self.buckets is not None and self.consumer_group is not None:
            raise ConfigError(
                "a reader of some buckets cannot record consumption for retention (the rest "
                "would count as unread, or as read); leave consumer_group unset with buckets"
            )
        if self.threads < 1:
            raise ConfigError(f"threads={self.threads}: give 1 or more decoding threads")
        if self.window_rows is not None and self.window_rows <= self.batch_size:
            raise ConfigError(
                f"window_rows={self.window_rows} must exceed batch_size={self.batch_size}"
            )

    @property
    def window(self) -> int:
        return self.window_rows or 16 * self.batch_size


@dataclass
class ReadStats:
    """What a reader has done so far: progress and shuffle quality."""

    batches: int = 0
    rows: int = 0
    shards_opened: int = 0
    distinct_shards: int = 0
    """Sum, over sampled batches, of the number of shards a batch's rows came from."""
    sampled: int = 0
    undelivered: int = 0
    """Rows a closed channel left that no batch could take without unbalancing the ranks."""

    @property
    def shards_per_batch(self) -> float:
        """Shuffle quality: distinct source shards in a batch, on average."""
        return self.distinct_shards / self.sampled if self.sampled else 0.0


@dataclass
class _Mark:
    """The cursor: where the window in progress began."""

    after: int = -1
    """Batch id of the last commit fully read (-1: none)."""
    before: list[int] | None = None
    """Every rank's rows over commits up to ``after``."""
    counters: tuple[int, int, int] = (0, 0, 0)
    """The planner's (windows, batches, carry) when the commit after ``after`` began."""
    window: int = 0
    """The window in progress (its ident); windows before it are done."""
    carry: np.ndarray = field(default_factory=lambda: _NO_REFS)
    """References (commit, shard, row) of the rows carried into that window."""


class _Materializer:
    """Turns windows into record batches; keeps only the shards still needed open.

    Shards are opened in the order the plan will use them, ``ahead_rows`` of them ahead, by two
    background threads: pyarrow releases the GIL while it reads and decompresses, so decoding
    the next shards overlaps gathering the current window. (One thread left the gather waiting
    for shards: two read ~20 % faster on two cores, measured with ``flow bench handoff``.)
    The bound is in rows, not shards: a window of streaming micro-batches' small shards draws on
    dozens of them, and a bound of 8 shards left the gather waiting for most of each window's.
    """

    def __init__(
        self,
        channel: Channel,
        options: ReadOptions,
        stats: ReadStats,
        *,
        epoch: int,
        map_files: bool,
    ) -> None:
        self.channel = channel
        self.epoch = epoch
        self.verify = options.verify
        self.map_files = map_files
        self.stats = stats
        self.ahead_rows = ahead_rows = options.prefetch * options.window
        self.commits: dict[int, Commit] = {}
        self._open: dict[tuple[int, int], pa.Table] = {}
        self._remaining: dict[tuple[int, int], int] = {}
        self._coming: deque[tuple[int, int]] = deque()
        self._loading: dict[tuple[int, int], Future[pa.Table]] = {}
        self._loading_rows = 0
        self._pool = (
            ThreadPoolExecutor(options.threads, thread_name_prefix="handoff-prefetch")
            if ahead_rows
            else None
        )
        self.carry: pa.Table | None = None
        self.carry_refs = _NO_REFS

    def close(self) -> None:
        if self._pool is not None:
            for future in self._loading.values():
                future.cancel()
            self._pool.shutdown(wait=True)

    def expect(self, commit: Commit, spans: list[Span]) -> None:
        self.commits[commit.batch_id] = commit
        for span in spans:
            key = (span.commit, span.index)
            if key not in self._remaining:
                self._coming.append(key)
            self._remaining[key] = self._remaining.get(key, 0) + span.rows
        self._fill()

    def _load(self, key: tuple[int, int]) -> pa.Table:
        commit, index = key
        if commit not in self.commits:
            self.commits[commit] = self.channel.commit(commit)
        shard = self.commits[commit].shards[index]
        return read_shard(
            self.channel.folder, shard, verify=self.verify, commit=commit, map_file=self.map_files
        )

    def _fill(self) -> None:
        if self._pool is None:
            return
        # Open shards (the current window's) are not counted: only those decoded ahead of use.
        while self._coming and (not self._loading or self._loading_rows < self.ahead_rows):
            key = self._coming.popleft()
            if key not in self._open and key not in self._loading and key in self._remaining:
                self._loading[key] = self._pool.submit(self._load, key)
                self._loading_rows += self._rows(key)

    def _rows(self, key: tuple[int, int]) -> int:
        return self.commits[key[0]].shards[key[1]].rows

    def _shard(self, commit: int, index: int) -> pa.Table:
        key = (commit, index)
        table = self._open.get(key)
        if table is None:
            future = self._loading.pop(key, None)
            if future is not None:
                self._loading_rows -= self._rows(key)
            table = future.result() if future is not None else self._load(key)
            self._open[key] = table
            self.stats.shards_opened += 1
            self._fill()
        return table

    def skip(self, window: Window) -> None:
        """A window read before the cursor was taken: account its rows, read nothing."""
        for span in window.spans:
            self._used(span)

    def _used(self, span: Span) -> None:
        key = (span.commit, span.index)
        self._remaining[key] = self._remaining.get(key, 0) - span.rows
        if self._remaining[key] <= 0:
            self._open.pop(key, None)
            self._remaining.pop(key, None)
            future = self._loading.pop(key, None)
            if future is not None:  # skipped (read before a resumed cursor) on its way in
                future.cancel()
                self._loading_rows -= self._rows(key)
            self._fill()

    def restore_carry(self, refs: np.ndarray) -> None:
        """Carried rows again, read back from their references (after a resume)."""
        parts = [self._shard(int(c), int(i)).slice(int(r), 1) for c, i, r in refs]
        self.carry = pa.concat_tables(parts).combine_chunks() if parts else None
        self.carry_refs = refs
        for key in [k for k in self._open if k not in self._remaining]:
            del self._open[key]  # opened only for the carried rows

    def window(self, window: Window, batches: list[BatchPlan]) -> list[pa.RecordBatch]:
        """The window's batches, gathered here; what it leaves is carried into the next one."""
        rows = self._rows_of(window, batches)
        if rows is None:
            return []
        # Shuffled: one gather of the window. In order: batches are slices of the shards, and
        # only a batch that straddles two of them is copied.
        ordered = (
            rows.table.take(pa.array(rows.order)).combine_chunks() if window.shuffle else rows.table
        )
        end = batches[-1].stop if batches else 0
        self.carry = ordered.slice(end).combine_chunks() if end < ordered.num_rows else None
        return [one_batch(ordered.slice(plan.start, plan.rows)) for plan in batches]

    def window_slices(self, window: Window, batches: list[BatchPlan]) -> list[WindowSlice]:
        """The window's batches as ranges of its unpermuted rows, for the consumer to gather.

        Only the carried rows (fewer than a batch and a row) are gathered here, in the order
        :meth:`window` carries them, so the next window is the same either way.
        """
        rows = self._rows_of(window, batches)
        if rows is None:
            return []
        end = batches[-1].stop if batches else 0
        left = rows.order[end:]
        self.carry = rows.table.take(pa.array(left)).combine_chunks() if len(left) else None
        return [WindowSlice(rows, plan.start, plan.stop) for plan in batches]

    def _rows_of(self, window: Window, batches: list[BatchPlan]) -> WindowRows | None:
        """The window's rows unpermuted (carried rows first) and its order; None when empty.

        Records shuffle quality for sampled batches and the references of the rows the window
        will carry, and releases the shards the window used up.
        """
        parts: list[pa.Table] = []
        bounds = [0]
        meta: list[tuple[int, int, int]] = []  # per part: commit, shard, first row (-1: carry)
        if window.carry and self.carry is not None:
            parts.append(self.carry)
            bounds.append(self.carry.num_rows)
            meta.append((-1, -1, -1))
        for span in window.spans:
            parts.append(self._shard(span.commit, span.index).slice(span.start, span.rows))
            bounds.append(bounds[-1] + span.rows)
            meta.append((span.commit, span.index, span.start))
        for span in window.spans:
            self._used(span)
        if not parts:
            self.carry, self.carry_refs = None, _NO_REFS
            return None
        table = pa.concat_tables(parts)
        order = window.permutation()
        starts = np.asarray(bounds)
        info = np.asarray(meta, dtype=np.int64)

        def part_of(first: int, stop: int | None = None) -> np.ndarray:
            """The part each of the permuted rows ``[first, stop)`` comes from."""
            return np.searchsorted(starts, order[first:stop], side="right") - 1

        shard_ids = np.unique(info[:, :2], axis=0, return_inverse=True)[1].reshape(-1)
        for plan in batches:
            if plan.ordinal % _SAMPLE == 0:  # shuffle quality, sampled: unique() is not free
                self.stats.sampled += 1
                self.stats.distinct_shards += len(
                    np.unique(shard_ids[part_of(plan.start, plan.stop)])
                )
        end = batches[-1].stop if batches else 0
        self.carry_refs = self._refs(order[end:], part_of(end), starts, info)
        key = (self.channel.name, self.epoch, window.ident)
        return WindowRows(table, order, window.shuffle, key)

    def _refs(
        self, positions: np.ndarray, parts: np.ndarray, starts: np.ndarray, info: np.ndarray
    ) -> np.ndarray:
        """(commit, shard, row) of the rows at ``positions`` of the window."""
        offsets = positions - starts[parts]
        refs = np.column_stack([info[parts, 0], info[parts, 1], info[parts, 2] + offsets])
        from_carry = info[parts, 0] < 0
        refs[from_carry] = self.carry_refs[offsets[from_carry]]
        return refs


class ChannelReader:
    """The batches of one channel for one rank of a trainer.

    Iterating yields one epoch (or, following, everything until the channel is closed), then
    moves to the next epoch. ``state_dict()`` after any batch, loaded into a new reader, goes on
    with exactly the batches not yet yielded.
    """

    def __init__(
        self,
        where: Any,
        channel: str,
        *,
        world: World | None = None,
        options: ReadOptions | None = None,
        expected_schema: pa.Schema | None = None,
    ) -> None:
        self.channel = Channel(where, channel)
        self.world = world or World()
        self.options = options or ReadOptions()
        if self.options.batch_size < 2:
            raise ConfigError(f"batch_size={self.options.batch_size} must be at least 2")
        meta = self.channel.meta()  # raises, naming what exists, before the first batch
        check_world(meta.num_buckets, self.world.world_size)
        outside = sorted(b for b in self.options.buckets or () if not 0 <= b < meta.num_buckets)
        if outside:
            raise ConfigError(
                f"buckets {outside} do not exist: channel {channel!r} has {meta.num_buckets}"
            )
        if expected_schema is not None:
            self.channel.check_schema(expected_schema)
        self.schema = meta.schema
        self._uncompressed = meta.compression is None  # its shards are used in place, mapped
        self.stats = ReadStats()
        self.epoch = 0
        self.position = 0
        """Batches yielded so far in this epoch."""
        self._upto: int | None = None
        self._totals: list[int] | None = None
        self._mark = _Mark(after=self.options.after_commit)
        self._recorded = 0.0
        self._carried: tuple[np.ndarray, list[list[int]]] | None = None

    # -- cursor -----------------------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        return {
            "channel": self.channel.name,
            "world": [self.world.rank, self.world.world_size],
            "batch_size": self.options.batch_size,
            "window_rows": self.options.window,
            "shuffle": self.options.shuffle,
            "seed": self.options.seed,
            "follow": self.options.follow,
            "buckets": sorted(self.options.buckets) if self.options.buckets is not None else None,
            "after_commit": self.options.after_commit,
        }

    def state_dict(self) -> dict[str, Any]:
        mark = self._mark
        return {
            "config": self._config(),
            "epoch": self.epoch,
            "position": self.position,
            "upto": self._upto,
            "totals": self._totals,
            "after": mark.after,
            "before": mark.before,
            "counters": list(mark.counters),
            "window": mark.window,
            "carry": self._carry_list(mark.carry),
        }

    def _carry_list(self, carry: np.ndarray) -> list[list[int]]:
        """``carry`` as lists, made once per window and shared by the cursors taken in it (up
        to a batch of rows: converting them for every batch held the GIL for milliseconds a
        batch, time a GPU trainer's loop thread needs). Treat cursors as read-only."""
        if self._carried is None or self._carried[0] is not carry:
            self._carried = (carry, carry.tolist())
        return self._carried[1]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["config"] != self._config():
            raise ConfigError(
                f"this cursor was saved by a reader with {state['config']}, not {self._config()}; "
                "resume with the same channel, world and read options"
            )
        self.epoch, self.position = state["epoch"], state["position"]
        self._upto, self._totals = state["upto"], state["totals"]
        carry = np.asarray(state["carry"], dtype=np.int64).reshape(-1, 3)
        self._mark = _Mark(
            state["after"], state["before"], tuple(state["counters"]), state["window"], carry
        )

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning."""
        self.epoch, self.position = epoch, 0
        self._upto = self._totals = None
        self._mark = _Mark(after=self.options.after_commit)

    # -- iteration --------------------------------------------------------------------------

    def _refs(self, commit: Commit) -> list[ShardRef]:
        chosen = self.options.buckets
        return [
            ShardRef(commit.batch_id, i, s.bucket, s.rows)
            for i, s in enumerate(commit.shards)
            if chosen is None or s.bucket in chosen
        ]

    def _record(self, consumed_upto: int, force: bool = False) -> None:
        group = self.options.consumer_group
        if group is None:
            return
        if not force and time.monotonic() - self._recorded < self.options.record_every:
            return
        self.channel.record(
            ConsumerPosition(
                group,
                self.world.rank,
                self.world.world_size,
                consumed_upto,
                datetime.now(UTC).isoformat(),
            )
        )
        self._recorded = time.monotonic()

    def _start_epoch(self) -> None:
        """Fix a finite epoch's commits and every rank's totals over them."""
        if self.options.follow or self._upto is not None:
            return
        ids = [b for b in self.channel.commit_ids() if b > self.options.after_commit]
        self._upto = ids[-1] if ids else self.options.after_commit
        commits = [self._refs(self.channel.commit(b)) for b in ids]
        self._totals = rank_totals(commits, self.world.world_size)

    def _next_commits(self, after: int) -> list[int]:
        ids = [b for b in self.channel.commit_ids() if b > after]
        if self._upto is not None:
            ids = [b for b in ids if b <= self._upto]
        return ids

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        """One epoch's batches (see the class docstring), gathered on the host."""
        return self._iterate(_Materializer.window)

    def slices(self) -> Iterator[WindowSlice]:
        """The same batches as iterating, as ranges of their shuffle windows, left ungathered
        (see :mod:`flow.handoff.slices`): for a trainer that permutes rows on its GPU. The
        cursor after each slice is the cursor after the batch it stands for."""
        return self._iterate(_Materializer.window_slices)

    def _iterate(
        self, cut: Callable[[_Materializer, Window, list[BatchPlan]], list[T]]
    ) -> Iterator[T]:
        options, world = self.options, self.world
        self._start_epoch()
        sizes = (
            batch_sizes(self._totals, world.rank, options.batch_size)
            if self._totals is not None
            else None
        )
        planner = RankPlanner(
            world.rank,
            options.batch_size,
            options.window,
            options.seed,
            self.epoch,
            sizes=sizes,
            shuffle=options.shuffle,
        )
        mark = self._mark
        planner.restore(mark.counters)
        before = list(mark.before or [0] * world.world_size)
        materializer = _Materializer(
            self.channel, options, self.stats, epoch=self.epoch, map_files=self._uncompressed
        )
        resume_window: int | None = mark.window
        self._record(mark.after, force=True)

        def run(windows: Iterator[tuple[Window, list[BatchPlan]]]) -> Iterator[T]:
            """Materialize and yield windows, picking up where a loaded cursor left off."""
            nonlocal resume_window
            for window, plans in windows:
                if resume_window is not None:
                    if window.ident < resume_window:
                        materializer.skip(window)  # read before the cursor was taken
                        continue
                    materializer.restore_carry(mark.carry)
                    resume_window = None
                self._mark.window, self._mark.carry = window.ident, materializer.carry_refs
                for plan, batch in zip(plans, cut(materializer, window, plans), strict=True):
                    if plan.ordinal < self.position:
                        continue  # yielded before the cursor was taken
                    self.position = plan.ordinal + 1
                    self.stats.batches += 1
                    self.stats.rows += batch.num_rows
                    yield batch

        def spans_of(commit: Commit, before: list[int]) -> list[Span]:
            """This rank's spans of ``commit``, told to the materializer so it opens them."""
            spans = assign(
                self._refs(commit),
                world.world_size,
                before=before,
                seed=options.seed,
                epoch=self.epoch,
            )[world.rank]
            materializer.expect(commit, spans)
            return spans

        after = mark.after
        ahead: dict[int, tuple[Commit, list[Span]]] = {}  # the next commit, planned early
        try:
            while True:
                ids = self._next_commits(after)
                if not ids:
                    if not options.follow:
                        break
                    if self.channel.closed() and not self._next_commits(after):
                        yield from run(planner.finish(before))
                        break
                    time.sleep(options.poll_interval)
                    continue
                for position, batch_id in enumerate(ids):
                    planned = ahead.pop(batch_id, None)
                    commit = planned[0] if planned else self.channel.commit(batch_id)
                    counters = planner.counters()
                    self._mark = _Mark(
                        after, list(before), counters, counters[0], materializer.carry_refs
                    )
                    spans = planned[1] if planned else spans_of(commit, before)
                    share = targets(commit.rows, before)
                    before = [b + s for b, s in zip(before, share, strict=True)]
                    if position + 1 < len(ids):
                        # Without this, the next commit's first shards were decoded only once
                        # its first window asked for them: at every commit the gather waited.
                        upcoming = self.channel.commit(ids[position + 1])
                        ahead[upcoming.batch_id] = (upcoming, spans_of(upcoming, before))
                    yield from run(planner.add(spans))
                    after = batch_id
                    carried = materializer.carry_refs
                    oldest = int(carried[:, 0].min()) if len(carried) else None
                    self._record(after if oldest is None else min(after, oldest - 1))
        finally:
            materializer.close()
        self.stats.undelivered = planner.undelivered
        self._record(after, force=True)
        self.set_epoch(self.epoch + 1)
