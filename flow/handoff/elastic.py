"""Elastic resume: an epoch that a world of N ranks stopped in, finished by a world of M ranks.

A reader's cursor is a position in its rank's part of the epoch's plan, and the plan is a pure
function of commit metadata (:mod:`flow.handoff.plan`). So the N cursors of a stopped world say
exactly which rows it read, and this module works it out without opening a shard:

* **What is left** (:func:`remainder`). Each old rank's plan is replayed from its cursor: from
  the commit in progress (the cursor holds the planner's counters and every rank's totals at
  its start) to the window in progress, whose permutation is recomputed. What a rank read is
  every row of its spans in commits before that one, except the rows carried into the window,
  plus the window's first rows (those of the batches it yielded). What is left is therefore a
  short list of row references (the unread rows of each old rank's window, fewer than a window
  and a batch per rank) and spans: the rest of the old ranks' spans in the commits each was in,
  or would have reached; commits no old rank had started are left whole.
* **Who reads it** (:func:`share`, :func:`start`). The new world reads what is left as an epoch
  of its own, planned by the same rules: the row references are split into M parts (sizes
  within one of each other) that each new rank starts with as carried rows (re-permuted in its
  first window), and every commit's leftover spans are shared out as a commit's shards are
  (owner ``bucket % M``, order permuted, balanced to within one row given the totals so far).
  Every new rank computes the same assignment from commit metadata and the N cursors: no
  communication, and each row of the epoch is read exactly once across the two worlds.

A cursor taken in a resumed epoch keeps the N cursors it came from, so it resumes on the same
world (exactly where it was), or is re-cut again for another (the remainder of a remainder).
The next epoch is planned for the new world as usual. Rejected alternative: re-sharding by
position alone (skip the first ``k`` rows of each new rank's plan) would read some rows twice
and some never, because ownership and balance depend on the world size.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from flow.errors import ConfigError
from flow.handoff.plan import (
    BatchPlan,
    Piece,
    RankPlanner,
    ShardRef,
    Span,
    Window,
    assign,
    assign_pieces,
    batch_sizes,
    keep_of,
    span_refs,
    targets,
)

__all__ = [
    "OldPlan",
    "Remainder",
    "Stop",
    "pieces_of",
    "remainder",
    "rows_of",
    "share",
    "start",
]

_NO_REFS = np.empty((0, 3), dtype=np.int64)


@dataclass(frozen=True)
class Remainder:
    """What an epoch has left to read after a world stopped in it."""

    carry: np.ndarray
    """References (commit, shard, row) of rows that were in the old ranks' windows, unread."""
    pieces: Mapping[int, tuple[Piece, ...]] = field(default_factory=dict)
    """Per commit up to ``horizon``: its rows left (a commit not named: none)."""
    horizon: int = -1
    """Commits after this batch id were started by no old rank: they are left whole."""


def pieces_of(rest: Remainder | None, commit: int, shards: Sequence[ShardRef]) -> list[Piece]:
    """The rows of ``commit`` (its ``shards``) that an epoch shares out."""
    if rest is None or commit > rest.horizon:
        return [Piece(s.bucket, Span(commit, s.index, 0, s.rows)) for s in shards]
    return list(rest.pieces.get(commit, ()))


def rows_of(rest: Remainder | None, commit: int, shards: Sequence[ShardRef]) -> int:
    """How many rows of ``commit`` an epoch shares out (all of them, unless it is resumed)."""
    if rest is None or commit > rest.horizon:
        return sum(s.rows for s in shards)
    return sum(p.span.rows for p in rest.pieces.get(commit, ()))


def share(
    rest: Remainder | None,
    commit: int,
    shards: Sequence[ShardRef],
    world_size: int,
    *,
    before: Sequence[int],
    seed: int,
    epoch: int,
) -> list[list[Span]]:
    """Every rank's spans of ``commit``: :func:`~flow.handoff.plan.assign` in a planned epoch,
    the same rules over what is left of it in a resumed one."""
    if rest is None:
        return assign(shards, world_size, before=before, seed=seed, epoch=epoch)
    pieces = pieces_of(rest, commit, shards)
    return assign_pieces(pieces, world_size, before=before, seed=seed, epoch=epoch)


def start(rest: Remainder | None, world_size: int) -> tuple[list[int], list[np.ndarray]]:
    """Every rank's totals at the epoch's start, and the rows each starts with carried.

    The leftover rows are cut in rank order into parts of ``targets`` sizes, so the running
    totals start within one row of each other, as :func:`~flow.handoff.plan.targets` keeps them.
    """
    if rest is None:
        return [0] * world_size, [_NO_REFS] * world_size
    sizes = targets(len(rest.carry), [0] * world_size)
    cuts = np.cumsum([0, *sizes])
    return sizes, [rest.carry[cuts[r] : cuts[r + 1]] for r in range(world_size)]


@dataclass(frozen=True)
class Stop:
    """Where one rank of the old world stopped: the plan fields of its reader cursor."""

    after: int
    """Batch id of the last commit it read whole (the commit in progress is the next one)."""
    before: Sequence[int] | None
    """Every rank's totals before the commit in progress (None: the epoch's start)."""
    counters: tuple[int, int, int]
    """Its planner's (windows, batches, carried rows) when that commit began."""
    window: int
    """The window in progress."""
    carry: np.ndarray
    """References of the rows carried into that window."""
    position: int
    """Batches it yielded in the epoch."""
    done: bool = False
    """It read the whole epoch (its cursor stood at the next epoch's start)."""


@dataclass(frozen=True)
class OldPlan:
    """How the old world read the epoch: what its plan depended on."""

    world_size: int
    batch_size: int
    window_rows: int
    seed: int
    epoch: int
    shuffle: bool
    totals: Sequence[int] | None
    """A finite epoch's totals per rank (its batch sizes follow); None when following."""
    rest: Remainder | None = None
    """What the epoch itself was resumed from, if the old world resumed it too."""
    whole: bool = False
    """It followed with whole commits (``ReadOptions.whole_commits``)."""

    def keep(self, before: Sequence[int], rank: int) -> int | None:
        return keep_of(before, rank) if self.whole else None


def remainder(
    plan: OldPlan,
    stops: Sequence[Stop],
    ids: Sequence[int],
    shards_of: Callable[[int], Sequence[ShardRef]],
) -> Remainder:
    """What the old world, stopped at ``stops`` (one per old rank), left of the epoch.

    ``ids`` are the epoch's commits in order (a following reader: those listed so far, which
    include every commit an old rank started); ``shards_of`` gives a commit's shards as the
    readers see them (their bucket subset). Raises ConfigError when the cursors cannot come
    from one run of this plan.
    """
    if len(stops) != plan.world_size:
        raise ConfigError(f"{len(stops)} cursors for a world of {plan.world_size} ranks")
    cached: dict[int, Sequence[ShardRef]] = {}

    def shards(commit: int) -> Sequence[ShardRef]:
        if commit not in cached:
            cached[commit] = shards_of(commit)
        return cached[commit]

    live = {r: s for r, s in enumerate(stops) if not s.done}
    current = {r: next((c for c in ids if c > s.after), None) for r, s in live.items()}
    started = [c for c in current.values() if c is not None]
    # A rank that read the whole epoch read its share of every commit: none is left whole.
    horizon = (ids[-1] if ids else -1) if len(live) < len(stops) else max(started, default=-1)
    befores: dict[int, list[int]] = {}
    if started:
        first = min(started)
        opening = next(s for r, s in live.items() if current[r] == first)
        before = list(opening.before or start(plan.rest, plan.world_size)[0])
        for commit in (c for c in ids if first <= c <= horizon):
            befores[commit] = before
            share_ = targets(rows_of(plan.rest, commit, shards(commit)), before)
            before = [b + s for b, s in zip(before, share_, strict=True)]
        for r, s in live.items():
            at = current[r]
            if at is not None and s.before is not None and list(s.before) != befores[at]:
                raise ConfigError(
                    f"the cursor of rank {r} disagrees with the others on the rows read before "
                    f"commit {at}: resume from the cursors of one checkpoint, all of its ranks"
                )
    left: dict[int, list[Piece]] = {}
    carried: list[np.ndarray] = []
    for r, s in live.items():
        at = current[r]
        if at is None:
            carried.append(s.carry)
            continue
        carried.append(_replay(plan, r, s, at, befores, shards, left))
        for commit in (c for c in ids if at < c <= horizon):
            spans = share(
                plan.rest,
                commit,
                shards(commit),
                plan.world_size,
                before=befores[commit],
                seed=plan.seed,
                epoch=plan.epoch,
            )[r]
            left.setdefault(commit, []).extend(_pieces(spans, shards(commit)))
    pieces = {c: _merged(c, p) for c, p in left.items()}
    if plan.rest is not None:  # what the old world had not reached of its own remainder
        pieces |= {c: p for c, p in plan.rest.pieces.items() if c > horizon}
        horizon = max(horizon, plan.rest.horizon)
    carry = np.concatenate(carried) if carried else _NO_REFS
    return Remainder(carry.reshape(-1, 3).astype(np.int64), pieces, horizon)


def _replay(
    plan: OldPlan,
    rank: int,
    stop: Stop,
    commit: int,
    befores: Mapping[int, list[int]],
    shards: Callable[[int], Sequence[ShardRef]],
    left: dict[int, list[Piece]],
) -> np.ndarray:
    """Replay ``rank``'s commit in progress: its windows after the one in progress go to
    ``left``; returns the rows of the window in progress not yet yielded."""
    sizes = batch_sizes(plan.totals, rank, plan.batch_size) if plan.totals is not None else None
    planner = RankPlanner(
        rank,
        plan.batch_size,
        plan.window_rows,
        plan.seed,
        plan.epoch,
        sizes=sizes,
        shuffle=plan.shuffle,
    )
    planner.restore(stop.counters)
    before = befores[commit]
    spans = share(
        plan.rest,
        commit,
        shards(commit),
        plan.world_size,
        before=before,
        seed=plan.seed,
        epoch=plan.epoch,
    )[rank]
    found: tuple[Window, list[BatchPlan]] | None = None
    share_ = targets(rows_of(plan.rest, commit, shards(commit)), before)
    after = [b + s for b, s in zip(before, share_, strict=True)]
    windows = planner.add(spans, plan.keep(after, rank))
    if plan.rest is not None and stop.counters[0] == 0:  # the epoch's carried rows first
        opening = start(plan.rest, plan.world_size)[0]
        windows = itertools.chain(planner.drain(plan.keep(opening, rank)), windows)
    for window, batches in windows:
        if window.ident == stop.window:
            found = (window, batches)
        elif window.ident > stop.window:
            left.setdefault(commit, []).extend(_pieces(list(window.spans), shards(commit)))
    if found is None and stop.position > planner.batches:
        # Its window in progress is a followed channel's last: the carried rows at its close.
        found = None
        if plan.totals is None and not plan.whole:
            terminal = planner.finish(after)
            found = next(((w, b) for w, b in terminal if w.ident == stop.window), None)
        if found is None:
            raise ConfigError(
                f"the cursor of rank {rank} stands at batch {stop.position}, beyond its plan: "
                "resume with the read options the checkpoint was taken with"
            )
    if found is None:
        return stop.carry  # the window in progress has not begun: only its carried rows
    window, batches = found
    if len(stop.carry) != window.carry:
        raise ConfigError(
            f"the cursor of rank {rank} carries {len(stop.carry)} rows into window "
            f"{window.ident}, its plan {window.carry}: resume with the read options the "
            "checkpoint was taken with"
        )
    rows = np.concatenate([stop.carry.reshape(-1, 3), span_refs(window.spans)])
    read = max((b.stop for b in batches if b.ordinal < stop.position), default=0)
    unread: np.ndarray = rows[window.permutation()][read:]
    return unread


def _pieces(spans: Sequence[Span], shards: Sequence[ShardRef]) -> list[Piece]:
    bucket = {s.index: s.bucket for s in shards}
    return [Piece(bucket[s.index], s) for s in spans]


def _merged(commit: int, pieces: Sequence[Piece]) -> tuple[Piece, ...]:
    """``pieces`` in shard order, adjacent ones joined (a canonical form: fewer, longer spans
    whichever old rank they came from)."""
    out: list[Piece] = []
    for piece in sorted(pieces, key=lambda p: (p.span.index, p.span.start)):
        last = out[-1] if out else None
        if last is not None and last.span.index == piece.span.index:
            if piece.span.start < last.span.stop:
                raise ConfigError(
                    f"two cursors both leave rows {piece.span.start}..{last.span.stop} of shard "
                    f"{piece.span.index} of commit {commit} unread: resume from the cursors of "
                    "one checkpoint"
                )
            if piece.span.start == last.span.stop:
                span = Span(commit, last.span.index, last.span.start, piece.span.stop)
                out[-1] = Piece(last.bucket, span)
                continue
        out.append(piece)
    return tuple(out)
