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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import pyarrow as pa

from flow.errors import CommitCorruptError, ConfigError
from flow.handoff.channel import Channel, ConsumerPosition
from flow.handoff.format import Commit
from flow.handoff.materialize import NO_REFS, Materializer
from flow.handoff.options import ReadOptions, ReadStats
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
from flow.handoff.sequence import MissingCommit
from flow.handoff.slices import WindowSlice

__all__ = ["ChannelReader", "ReadOptions", "ReadStats"]


class _Rows(Protocol):
    @property
    def num_rows(self) -> int: ...


T = TypeVar("T", bound=_Rows)
"""What a reader yields: record batches, or window slices."""


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
    carry: np.ndarray = field(default_factory=lambda: NO_REFS)
    """References (commit, shard, row) of the rows carried into that window."""


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
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.channel = Channel(where, channel)
        self.sleep = sleep
        """How a following reader pauses between looks for new commits (tests pass their own)."""
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
        return self._iterate(Materializer.window)

    def slices(self) -> Iterator[WindowSlice]:
        """The same batches as iterating, as ranges of their shuffle windows, left ungathered
        (see :mod:`flow.handoff.slices`): for a trainer that permutes rows on its GPU. The
        cursor after each slice is the cursor after the batch it stands for."""
        return self._iterate(Materializer.window_slices)

    def _iterate(
        self, cut: Callable[[Materializer, Window, list[BatchPlan]], list[T]]
    ) -> Iterator[T]:
        # A generator, so nothing is opened (threads, shards) until the first batch is asked for.
        yield from _EpochWalk(self, cut)


class _EpochWalk(Generic[T]):
    """One epoch of one rank, commit after commit.

    Each commit's spans are planned (the next commit's ahead of time, so its shards are decoded
    while this one's last windows are gathered), cut into windows and batches, and the batches a
    loaded cursor has already delivered are skipped. The reader's cursor (``_mark``) is moved at
    each commit and window; following, the walk waits for commits until the channel closes.

    **A gap is an error.** A commit is read only once the commit before it in its writer's
    sequence (``previous``) has been read, or lies at or before ``after_commit`` or the cursor,
    or was retired. A finite epoch checks every commit it will read, and every writer's head
    (a lost end of a sequence), before its first batch, and raises MissingCommitError at once.
    A following walk reads the commits before the gap, then waits for the missing one up to
    ``missing_commit_wait`` seconds (counted in the pauses it sleeps) and raises if it has not
    come; at the channel's close it checks the heads the same way. It never reads past a gap:
    every rank must read the same commits in the same order.
    """

    def __init__(
        self,
        reader: ChannelReader,
        cut: Callable[[Materializer, Window, list[BatchPlan]], list[T]],
    ) -> None:
        self.reader = reader
        self.cut = cut
        options, world = reader.options, reader.world
        reader._start_epoch()
        sizes = (
            batch_sizes(reader._totals, world.rank, options.batch_size)
            if reader._totals is not None
            else None
        )
        self.planner = RankPlanner(
            world.rank,
            options.batch_size,
            options.window,
            options.seed,
            reader.epoch,
            sizes=sizes,
            shuffle=options.shuffle,
        )
        self.start = reader._mark
        """The cursor the walk began at: windows before its window were read already."""
        self.planner.restore(self.start.counters)
        self.before = list(self.start.before or [0] * world.world_size)
        self.after = self.start.after
        self.resume_window: int | None = self.start.window
        self.ahead: dict[int, tuple[Commit, list[Span]]] = {}
        self.loaded: dict[int, Commit] = {}
        """Commits listed and checked, not read yet."""
        self.last_read: dict[str, int] = {}
        """Batch id of the latest commit of each writer this walk has read."""
        self.floor = max(options.after_commit, self.start.after)
        """Commits at or before this batch id are not this walk's to read."""
        self.materializer = Materializer(
            reader.channel,
            options,
            reader.stats,
            epoch=reader.epoch,
            map_files=reader._uncompressed,
        )

    def __iter__(self) -> Iterator[T]:
        reader = self.reader
        reader._record(self.after, force=True)
        try:
            yield from self._commits()
        finally:
            self.materializer.close()
        reader.stats.undelivered = self.planner.undelivered
        reader._record(self.after, force=True)
        reader.set_epoch(reader.epoch + 1)

    def _commits(self) -> Iterator[T]:
        """Every commit of the epoch; following, as they land, until the channel closes."""
        reader, options = self.reader, self.reader.options
        waited = 0.0
        while True:
            ids, gap = self._ready(reader._next_commits(self.after))
            if not options.follow:
                # Before reading any of it: a finite epoch is all or nothing.
                gap = gap or self._lost_head()
                if gap is not None:
                    raise gap.error()
            for position, batch_id in enumerate(ids):
                upcoming = ids[position + 1] if position + 1 < len(ids) else None
                yield from self._commit(batch_id, upcoming)
            if ids:
                waited = 0.0
            if gap is None:
                if ids:
                    continue
                if not options.follow:
                    return
                if reader.channel.closed() and not reader._next_commits(self.after):
                    gap = self._lost_head()
                    if gap is None:
                        yield from self._windows(self.planner.finish(self.before))
                        return
            if gap is not None:
                if waited >= options.missing_commit_wait:
                    raise gap.error(f" (waited {waited:.1f}s for it)")
                waited += options.poll_interval
            reader.sleep(options.poll_interval)

    def _ready(self, ids: list[int]) -> tuple[list[int], MissingCommit | None]:
        """``ids`` up to the first commit whose predecessor in its writer's sequence is neither
        read, nor listed before it, nor out of this walk's range, nor retired; and that gap."""
        channel = self.reader.channel
        latest = dict(self.last_read)  # as it will be when each commit's turn comes
        for position, batch_id in enumerate(ids):
            commit = self.loaded.get(batch_id)
            if commit is None:
                commit = self.loaded[batch_id] = channel.commit(batch_id)
                disagreement = commit.disagreement()
                if disagreement is not None:
                    raise CommitCorruptError(f"channel {channel.name!r}: {disagreement}")
            previous = commit.previous
            if (
                commit.seq
                and previous is not None
                and previous > self.floor
                and latest.get(commit.writer) != previous
                and not channel.retired(previous)
            ):
                gap = MissingCommit(
                    channel.name,
                    commit.writer,
                    commit.seq - 1,
                    commit.seq - 1,
                    (previous,),
                    before=batch_id,
                )
                return ids[:position], gap
            latest[commit.writer] = batch_id
        return ids, None

    def _lost_head(self) -> MissingCommit | None:
        """A writer's latest commit, per its head, that is not there (nor read, nor retired)."""
        channel = self.reader.channel
        for head in channel.heads().values():  # heads first: they name finished commits only
            batch_id = head.batch_id
            if (
                batch_id > self.floor
                and self.last_read.get(head.writer, -1) < batch_id
                and not channel.committed(batch_id)
                and not channel.retired(batch_id)
            ):
                return MissingCommit(channel.name, head.writer, head.seq, head.seq, (batch_id,))
        return None

    def _commit(self, batch_id: int, upcoming: int | None) -> Iterator[T]:
        """One commit's batches; the cursor moves to its start first, past it after."""
        reader, materializer = self.reader, self.materializer
        planned = self.ahead.pop(batch_id, None)
        commit = planned[0] if planned else self._take(batch_id)
        counters = self.planner.counters()
        reader._mark = _Mark(
            self.after, list(self.before), counters, counters[0], materializer.carry_refs
        )
        spans = planned[1] if planned else self._spans(commit)
        # The rows read, not the commit's: with a bucket subset they differ, and the shares
        # must be those the epoch's totals (and so its batch sizes) were computed with.
        share = targets(sum(s.rows for s in reader._refs(commit)), self.before)
        self.before = [b + s for b, s in zip(self.before, share, strict=True)]
        if upcoming is not None:
            # Without this, the next commit's first shards were decoded only once its first
            # window asked for them: at every commit the gather waited.
            following = self._take(upcoming)
            self.ahead[upcoming] = (following, self._spans(following))
        yield from self._windows(self.planner.add(spans))
        self.after = batch_id
        self.last_read[commit.writer] = batch_id
        carried = materializer.carry_refs
        oldest = int(carried[:, 0].min()) if len(carried) else None
        reader._record(self.after if oldest is None else min(self.after, oldest - 1))

    def _take(self, batch_id: int) -> Commit:
        loaded = self.loaded.pop(batch_id, None)
        return loaded if loaded is not None else self.reader.channel.commit(batch_id)

    def _spans(self, commit: Commit) -> list[Span]:
        """This rank's spans of ``commit`` (after the rows ``before`` it), told to the
        materializer so it opens their shards."""
        reader = self.reader
        spans = assign(
            reader._refs(commit),
            reader.world.world_size,
            before=self.before,
            seed=reader.options.seed,
            epoch=reader.epoch,
        )[reader.world.rank]
        self.materializer.expect(commit, spans)
        return spans

    def _windows(self, windows: Iterator[tuple[Window, list[BatchPlan]]]) -> Iterator[T]:
        """Materialize and yield windows, picking up where a loaded cursor left off."""
        reader, materializer = self.reader, self.materializer
        for window, plans in windows:
            if self.resume_window is not None:
                if window.ident < self.resume_window:
                    materializer.skip(window)  # read before the cursor was taken
                    continue
                materializer.restore_carry(self.start.carry)
                self.resume_window = None
            reader._mark.window, reader._mark.carry = window.ident, materializer.carry_refs
            for plan, batch in zip(plans, self.cut(materializer, window, plans), strict=True):
                if plan.ordinal < reader.position:
                    continue  # yielded before the cursor was taken
                reader.position = plan.ordinal + 1
                reader.stats.batches += 1
                reader.stats.rows += batch.num_rows
                yield batch
