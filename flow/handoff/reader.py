"""Reading a channel: one rank's batches, shuffled in windows, resumable, followable.

The reader executes the plan of :mod:`flow.handoff.plan` on data: it opens the shards a window
needs (read ahead by two threads, checksums verified), gathers the window's rows in their
permuted order once, and hands out zero-copy slices of it as Arrow record batches.

Its cursor is taken at the start of the window in progress: the commit being read, every
rank's row totals before it, the planner's counters when that commit began, and the references
of the rows carried into the window (fewer than a batch and a row). Resuming costs the span
arithmetic of one commit and one window's permutation, however long the channel, and never
needs commits that retention has already deleted.

Every rank's cursor together (:func:`every_rank`) resumes on another number of ranks: the epoch
in progress is re-cut (:mod:`flow.handoff.elastic`) so the new ranks read exactly the rows the
old ones had not, and a cursor of the re-cut epoch keeps the old cursors it came from.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import pyarrow as pa

from flow.errors import CommitCorruptError, ConfigError
from flow.handoff.channel import Channel, ConsumerPosition
from flow.handoff.elastic import OldPlan, Remainder, Stop, remainder, rows_of, share, start
from flow.handoff.format import Commit
from flow.handoff.materialize import NO_REFS, Materializer
from flow.handoff.options import ReadOptions, ReadStats
from flow.handoff.pickup import Origin, PickUps
from flow.handoff.plan import (
    BatchPlan,
    RankPlanner,
    ShardRef,
    Span,
    Window,
    World,
    batch_sizes,
    keep_of,
    targets,
)
from flow.handoff.sequence import MissingCommit
from flow.handoff.slices import WindowSlice

__all__ = ["ChannelReader", "ReadOptions", "ReadStats", "every_rank"]

EVERY_RANK = "every_rank"


def every_rank(cursors: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The cursors of every rank of a world (rank order), as one cursor to load.

    A reader of the same world loads its own rank's; a reader of another world size re-cuts
    the epoch in progress so that its ranks read exactly what the old ranks had not.
    """
    return {EVERY_RANK: list(cursors)}


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
        self._rest: Remainder | None = None
        """What this epoch reads when it was re-cut from another world's cursors, else None."""
        self._resumed: dict[str, Any] | None = None
        """Those cursors (``resumed`` in this reader's cursor)."""
        self._recorded = 0.0
        self._carried: tuple[np.ndarray, list[list[int]]] | None = None
        self.pickups = PickUps()
        """Following: when each commit read was picked up (the poll that listed it), the latest
        ones by batch id (:mod:`flow.handoff.pickup`)."""
        self.origin: Origin | None = None
        """Following: the commits the last batch's shuffle window came from, with their pick-ups
        (None when not following). Read it right after each batch, as the cursor."""

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
            # Only when on: a cursor of full batches (or of an older version) keeps its config.
            **({"whole_commits": True} if self._whole else {}),
        }

    @property
    def _whole(self) -> bool:
        """Following with whole commits (``ReadOptions.whole_commits``)."""
        return self.options.follow and self.options.whole_commits

    def state_dict(self) -> dict[str, Any]:
        mark = self._mark
        resumed = {"resumed": self._resumed} if self._resumed is not None else {}
        return resumed | {
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
        """Continue after a cursor of this reader's world, or of :func:`every_rank`."""
        if EVERY_RANK in state:
            self._load_every_rank(state[EVERY_RANK])
            return
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
        self._resumed = state.get("resumed")
        self._rest = self._rest_of(self._resumed["cursors"]) if self._resumed else None

    def _rest_of(self, cursors: list[dict[str, Any]]) -> Remainder:
        """What the cursors a re-cut epoch came from left of it (they had read some of it)."""
        recut = self._recut(cursors)
        if recut is None:
            raise ConfigError(
                "this cursor says its epoch was re-cut from cursors that had read none of it: "
                "it was not saved by a reader; resume from a checkpoint's cursors"
            )
        return recut[1]

    def _load_every_rank(self, cursors: list[dict[str, Any]]) -> None:
        """Every rank's cursor of a world: ours if it is this world, else the epoch re-cut."""
        size = _world_of(cursors[0])[1] if cursors else 0
        if size == self.world.world_size:
            self.load_state_dict(cursors[self.world.rank])
            return
        recut = self._recut(cursors)
        if recut is None:  # at an epoch's start: nothing to re-cut
            self.set_epoch(max(c["epoch"] for c in cursors))
            return
        epoch, rest, upto, after = recut
        self.set_epoch(epoch)
        self._rest, self._resumed = rest, {"cursors": list(cursors)}
        before, carries = start(rest, self.world.world_size)
        if not self.options.follow:
            self._upto = upto
            self._totals = self._plan_totals(self._epoch_ids(upto), rest, self.world.world_size)
        mine = carries[self.world.rank]
        self._mark = _Mark(after, before, (0, 0, len(mine)), 0, mine)

    def _recut(
        self, cursors: list[dict[str, Any]]
    ) -> tuple[int, Remainder, int | None, int] | None:
        """What another world's ``cursors`` left of their epoch: (epoch, rest, the epoch's last
        commit, the commit before the first one with rows left); None at an epoch's start.

        Ranks stop in step (a trainer checkpoints them at one step), so their cursors are in
        one epoch, or a rank that finished it stands at the next one's start.
        """
        size = len(cursors)
        for rank, cursor in enumerate(cursors):
            wanted = self._config() | {"world": [rank, size]}
            if "config" not in cursor or cursor["config"] != wanted:
                raise ConfigError(
                    f"cursor {rank} of {size} was saved by a reader with "
                    f"{cursor.get('config')}, not {wanted}: resume from every rank's cursor of "
                    "one checkpoint, with the same channel and read options (only the number of "
                    "ranks may change)"
                )
        epoch = min(c["epoch"] for c in cursors)
        fresh = [self._fresh(c) for c in cursors]
        stops: list[Stop] = []
        for rank, cursor in enumerate(cursors):
            if cursor["epoch"] == epoch:
                stops.append(_stop(cursor))
            elif cursor["epoch"] == epoch + 1 and fresh[rank]:
                stops.append(replace(_stop(cursor), done=True))
            else:
                raise ConfigError(
                    f"rank {rank}'s cursor is in epoch {cursor['epoch']}, another's in {epoch}: "
                    "resume from every rank's cursor of one checkpoint"
                )
        if all(s.done for s in stops) or (all(fresh) and not any(s.done for s in stops)):
            return None
        started = [c for c in cursors if c["epoch"] == epoch and not self._fresh(c)]
        resumed = started[0].get("resumed") if started else None
        if any(c.get("resumed") != resumed for c in started):
            raise ConfigError("the cursors come from different resumptions of their epoch")
        base = self._rest_of(resumed["cursors"]) if resumed is not None else None
        options = self.options
        upto = next((c["upto"] for c in started if c["upto"] is not None), None)
        ids = self._epoch_ids(upto)
        totals = next((c["totals"] for c in started if c["totals"] is not None), None)
        if not options.follow and totals is None:  # no rank began it: as it begins now
            upto = ids[-1] if ids else options.after_commit
            totals = self._plan_totals(ids, base, size)
        plan = OldPlan(
            size,
            options.batch_size,
            options.window,
            options.seed,
            epoch,
            options.shuffle,
            None if options.follow else totals,
            base,
            whole=self._whole,
        )
        rest = remainder(plan, stops, ids, lambda b: self._refs(self._commit(b)))
        after = min((s.after for s in stops if not s.done), default=options.after_commit)
        return epoch, rest, upto, after

    def _fresh(self, cursor: dict[str, Any]) -> bool:
        """At its epoch's start, nothing read (a resumed epoch's start has rows carried)."""
        return (
            cursor["position"] == 0
            and cursor["after"] == self.options.after_commit
            and "resumed" not in cursor
            and not cursor["carry"]
        )

    def _commit(self, batch_id: int) -> Commit:
        """A commit from the log this reader holds (no read), else from its record."""
        found = self.channel.log.commit(batch_id)
        return found if found is not None else self.channel.commit(batch_id)

    def _epoch_ids(self, upto: int | None) -> list[int]:
        self.channel.log.ensure()
        return self.channel.log.ids(self.options.after_commit, upto)

    def _plan_totals(self, ids: list[int], rest: Remainder | None, size: int) -> list[int]:
        """Every rank's rows, in a world of ``size``, over the epoch's commits ``ids`` (of what
        is left of them, re-cut): its batch sizes follow.

        :func:`~flow.handoff.plan.targets` keeps the ranks' totals in one shape: the first
        ``total % size`` ranks one row ahead of the others. So the totals follow from the sum
        of the rows alone, which the log gives without reading a record (a million commits in
        milliseconds, where sharing them out commit by commit took seconds).
        """
        horizon = rest.horizon if rest is not None else -1
        resumed = [b for b in ids if b <= horizon]
        later = ids[len(resumed) :] if resumed == ids[: len(resumed)] else None
        if later is None:  # not in order: cannot happen for a sorted log, but stay exact
            resumed, later = [b for b in ids if b <= horizon], [b for b in ids if b > horizon]
        total = sum(start(rest, size)[0])
        total += sum(rows_of(rest, b, ()) for b in resumed)
        total += self.channel.log.rows(later, self.options.buckets)
        return [total // size + (1 if r < total % size else 0) for r in range(size)]

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning."""
        self.epoch, self.position = epoch, 0
        self._upto = self._totals = None
        self._mark = _Mark(after=self.options.after_commit)
        self._rest = self._resumed = None

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
        ids = self._epoch_ids(None)
        self._upto = ids[-1] if ids else self.options.after_commit
        self._totals = self._plan_totals(ids, self._rest, self.world.world_size)

    def _next_commits(self, after: int) -> list[int]:
        """The commits after ``after`` to read; following, after a look at the writers' heads
        (one LIST and a GET a writer: :meth:`flow.handoff.log.CommitLog.refresh`)."""
        log = self.channel.log
        if self._upto is None:
            log.refresh()
        else:
            log.ensure()
        return log.ids(after, self._upto)

    def _closed(self) -> bool:
        """Whether the producer had closed the channel at the last look for commits."""
        log = self.channel.log
        return log.closed if not log.legacy else self.channel.closed()

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
        # Not past the carried rows' commits: a re-cut epoch starts with rows of older ones.
        reader._record(_read_upto(self.after, self.start.carry), force=True)
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
        if reader._rest is not None and self.start.counters[0] == 0:
            # A re-cut epoch's window 0: the rows its ranks start with (flow.handoff.elastic).
            yield from self._windows(self.planner.drain(self._keep()))
        waited = 0.0
        while True:
            listed = reader._next_commits(self.after)
            found = time.time()  # picked up: what this poll listed (flow.handoff.pickup)
            ids, gap = self._ready(listed)
            if not options.follow:
                # Before reading any of it: a finite epoch is all or nothing.
                gap = gap or self._lost_head()
                if gap is not None:
                    raise gap.error()
            for position, batch_id in enumerate(ids):
                upcoming = ids[position + 1] if position + 1 < len(ids) else None
                yield from self._commit(batch_id, upcoming, found)
            if ids:
                waited = 0.0
            if gap is None:
                if ids:
                    continue
                if not options.follow:
                    return
                if reader._closed() and not reader._next_commits(self.after):
                    gap = self._lost_head()
                    if gap is None:
                        if not reader._whole:  # whole commits were yielded as they came
                            yield from self._windows(self.planner.finish(self.before))
                        return
            if gap is not None:
                if waited >= options.missing_commit_wait:
                    raise gap.error(f" (waited {waited:.1f}s for it)")
                waited += options.poll_interval
            reader.sleep(options.poll_interval)

    def _ready(self, ids: list[int]) -> tuple[list[int], MissingCommit | None]:
        """``ids`` up to the first commit whose predecessor in its writer's sequence is neither
        read, nor listed before it, nor out of this walk's range, nor retired; and that gap.

        From the log's arrays, without reading a record: a million commits in milliseconds."""
        channel = self.reader.channel
        if not ids:
            return ids, None
        links = channel.log.links(ids)
        if links.bad.any():
            batch_id = int(links.ids[int(np.argmax(links.bad))])
            disagreement = self.reader._commit(batch_id).disagreement()
            raise CommitCorruptError(f"channel {channel.name!r}: {disagreement}")
        # The batch id before each commit of the same writer in this list (or read already).
        prior = np.full(len(ids), -2, dtype=np.int64)
        order = np.argsort(links.writer, kind="stable")
        grouped = links.writer[order]
        same = np.concatenate([[False], grouped[1:] == grouped[:-1]])
        shifted = np.concatenate([[-2], links.ids[order][:-1]])
        prior[order] = np.where(same, shifted, -2)
        firsts = order[~same]
        for position in firsts.tolist():
            writer = self._writer_of(int(links.writer[position]))
            prior[position] = self.last_read.get(writer, -2) if writer is not None else -2
        suspect = (
            (links.seq >= 1)
            & (links.previous >= 0)
            & (links.previous > self.floor)
            & (prior != links.previous)
        )
        for position in np.flatnonzero(suspect).tolist():
            previous = int(links.previous[position])
            if channel.retired(previous):
                continue
            batch_id = int(links.ids[position])
            commit = self.reader._commit(batch_id)
            gap = MissingCommit(
                channel.name,
                commit.writer,
                int(links.seq[position]) - 1,
                int(links.seq[position]) - 1,
                (previous,),
                before=batch_id,
            )
            return ids[:position], gap
        return ids, None

    def _writer_of(self, code: int) -> str | None:
        for writer, known in self.reader.channel.log.codes().items():
            if known == code:
                return writer
        return None

    def _lost_head(self) -> MissingCommit | None:
        """A writer's latest commit, per its head, that is not there (nor read, nor retired)."""
        channel = self.reader.channel
        for head in channel.heads().values():  # heads first: they name finished commits only
            batch_id = head.batch_id
            if (
                batch_id > self.floor
                and self.last_read.get(head.writer, -1) < batch_id
                and not channel.log.has(batch_id)
                and not channel.committed(batch_id)
                and not channel.retired(batch_id)
            ):
                return MissingCommit(channel.name, head.writer, head.seq, head.seq, (batch_id,))
        return None

    def _commit(self, batch_id: int, upcoming: int | None, found: float) -> Iterator[T]:
        """One commit's batches; the cursor moves to its start first, past it after.
        ``found``: when the poll that listed it ended."""
        reader, materializer = self.reader, self.materializer
        planned = self.ahead.pop(batch_id, None)
        commit = planned[0] if planned else self._take(batch_id)
        if reader.options.follow:
            reader.pickups.add(commit, found)
        counters = self.planner.counters()
        reader._mark = _Mark(
            self.after, list(self.before), counters, counters[0], materializer.carry_refs
        )
        spans = planned[1] if planned else self._spans(commit)
        # The rows read, not the commit's: with a bucket subset (or a re-cut epoch) they
        # differ, and the shares must be those the epoch's totals were computed with.
        rows = rows_of(reader._rest, commit.batch_id, reader._refs(commit))
        share = targets(rows, self.before)
        self.before = [b + s for b, s in zip(self.before, share, strict=True)]
        if upcoming is not None:
            # Without this, the next commit's first shards were decoded only once its first
            # window asked for them: at every commit the gather waited.
            following = self._take(upcoming)
            self.ahead[upcoming] = (following, self._spans(following))
        yield from self._windows(self.planner.add(spans, self._keep()))
        self.after = batch_id
        self.last_read[commit.writer] = batch_id
        reader._record(_read_upto(self.after, materializer.carry_refs))

    def _keep(self) -> int | None:
        """With whole commits, the rows this rank carries past the rows read so far."""
        return keep_of(self.before, self.reader.world.rank) if self.reader._whole else None

    def _take(self, batch_id: int) -> Commit:
        return self.reader._commit(batch_id)

    def _spans(self, commit: Commit) -> list[Span]:
        """This rank's spans of ``commit`` (after the rows ``before`` it), told to the
        materializer so it opens their shards."""
        reader = self.reader
        spans = share(
            reader._rest,
            commit.batch_id,
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
            carried = materializer.carry_refs if window.carry else NO_REFS
            batches = self.cut(materializer, window, plans)
            if reader.options.follow:
                reader.origin = reader.pickups.origin(window.spans, carried, time.time())
            for plan, batch in zip(plans, batches, strict=True):
                if plan.ordinal < reader.position:
                    continue  # yielded before the cursor was taken
                reader.position = plan.ordinal + 1
                reader.stats.batches += 1
                reader.stats.rows += batch.num_rows
                yield batch


def _world_of(cursor: dict[str, Any]) -> list[int]:
    if "config" not in cursor:
        raise ConfigError(f"not a channel reader's cursor (keys {sorted(cursor)})")
    world: list[int] = cursor["config"]["world"]
    return world


def _stop(cursor: dict[str, Any]) -> Stop:
    return Stop(
        cursor["after"],
        cursor["before"],
        tuple(cursor["counters"]),
        cursor["window"],
        np.asarray(cursor["carry"], dtype=np.int64).reshape(-1, 3),
        cursor["position"],
    )


def _read_upto(after: int, carried: np.ndarray) -> int:
    """The commit up to which everything was read: ``after``, unless rows carried on (to be
    read yet) come from it or one before it."""
    return min(after, int(carried[:, 0].min()) - 1) if len(carried) else after
