"""Which rows each rank reads, in which order: pure functions of commit metadata.

Everything here is computed from commit records (bucket and row count of every shard), a seed,
an epoch and a rank, never from the data or the clock. So every rank derives the same global
assignment, a restarted reader recomputes exactly the sequence it was in, and the rules can be
property-tested without touching a file.

* **Ownership.** A shard belongs to rank ``bucket % world_size``; each owner reads its shards in
  an order permuted by ``(seed, epoch, commit, owner)``. Any world size works: when it does not
  divide the bucket count some ranks own one bucket more, and balancing evens the rows out.
* **Balance.** Within each commit, owners with more rows than their share hand the tail of
  their sequence to ranks with fewer, so every rank gets ``floor`` or ``ceil`` of
  ``rows / world_size``; a commit's extra rows go to the ranks with the fewest rows so far, which
  keeps every rank's running total within one row of the others.
* **Shuffle.** A rank's rows pass through windows of at most ``window_rows`` rows drawn in
  stripes from up to ``stripe`` shards at a time, each window permuted by
  ``(seed, epoch, rank, window)``; rows a window leaves after its last full batch are carried
  into the next window (and re-permuted there).
* **Batches.** In a finite epoch the totals are known up front: every rank yields the same
  number of batches and every row exactly once (the last batch may hold one extra row). When
  following a growing channel with whole commits (the default), each commit's rows are yielded
  before the next commit is waited for: full batches and one smaller last one, the same number
  on every rank (:func:`keep_of`); a rank may carry one row on. Without, ranks yield full
  batches as commits land (rows short of a batch wait for the next commit) and at the channel's
  close the final partial batches are yielded if every rank has one. Either way the few rows
  that would unbalance the ranks (fewer than ``world_size``) are reported as undelivered.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from flow.errors import ConfigError

__all__ = [
    "BatchPlan",
    "Piece",
    "RankPlanner",
    "RowTracker",
    "ShardRef",
    "Span",
    "Window",
    "World",
    "assign",
    "assign_pieces",
    "batch_sizes",
    "keep_of",
    "rank_totals",
    "span_refs",
]


@dataclass(frozen=True)
class World:
    """This process's place among the trainer's ranks."""

    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is not in a world of {self.world_size}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> World:
        """RANK and WORLD_SIZE as torchrun sets them (0 and 1 when absent)."""
        env = os.environ if env is None else env
        return cls(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)))


@dataclass(frozen=True)
class ShardRef:
    """A shard as commit metadata describes it."""

    commit: int
    index: int
    bucket: int
    rows: int


@dataclass(frozen=True)
class Span:
    """Rows ``[start, stop)`` of shard ``index`` of commit ``commit``."""

    commit: int
    index: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def _stripe(spans: Sequence[Span], n: int, width: int) -> tuple[list[Span], list[Span]]:
    """``n`` rows taken evenly from the first ``width`` spans, and what is left of all spans.

    A window striped over several shards mixes them, where taking rows in order would fill it
    from one or two. Spans keep their order; what a span has left stays in its place.
    """
    head: list[Span] = []
    rest = list(spans)
    while n > 0 and rest:
        front = rest[:width]
        share = max(n // len(front), 1)
        taken_any = False
        remaining: list[Span] = []
        for span in front:
            take = min(share, span.rows, n)
            if take > 0:
                head.append(Span(span.commit, span.index, span.start, span.start + take))
                n -= take
                taken_any = True
            if span.start + take < span.stop:
                remaining.append(Span(span.commit, span.index, span.start + take, span.stop))
        rest = remaining + rest[width:]
        if not taken_any:
            break
    return head, rest


def _take(spans: Sequence[Span], n: int) -> tuple[list[Span], list[Span]]:
    """The first ``n`` rows of ``spans`` and the rest."""
    head: list[Span] = []
    for i, span in enumerate(spans):
        if n <= 0:
            return head, list(spans[i:])
        if span.rows <= n:
            head.append(span)
            n -= span.rows
        else:
            cut = span.start + n
            head.append(Span(span.commit, span.index, span.start, cut))
            return head, [Span(span.commit, span.index, cut, span.stop), *spans[i + 1 :]]
    return head, []


def keep_of(before: Sequence[int], rank: int) -> int:
    """Rows ``rank`` carries past a commit when a following world reads commits whole: those
    beyond the fewest any rank has (``before``: every rank's totals after the commit).

    Every rank then has yielded the same rows in all, in the same number of batches (a commit's
    rows cut into full batches and one smaller last one), so ranks stay in step commit by
    commit; the totals are within one row of each other (:func:`targets`), so this is 0 or 1.
    """
    return before[rank] - min(before)


def targets(rows: int, before: Sequence[int]) -> list[int]:
    """How many of a commit's ``rows`` each rank gets, given their totals ``before`` it.

    Everyone gets ``rows // world_size``; the remainder goes one each to the ranks with the
    fewest rows so far (lowest rank first on ties), so running totals never differ by more than
    one row.
    """
    world_size = len(before)
    base, extra = divmod(rows, world_size)
    lucky = set(sorted(range(world_size), key=lambda r: (before[r], r))[:extra])
    return [base + (1 if r in lucky else 0) for r in range(world_size)]


@dataclass(frozen=True)
class Piece:
    """Rows of a shard to share out, with the shard's bucket (which decides their owner)."""

    bucket: int
    span: Span


def assign(
    shards: Sequence[ShardRef],
    world_size: int,
    *,
    before: Sequence[int],
    seed: int,
    epoch: int,
) -> list[list[Span]]:
    """The spans of one commit each rank reads, balanced to within one row.

    ``before`` are the ranks' totals over the earlier commits (:func:`rank_totals`).
    """
    pieces = [Piece(s.bucket, Span(s.commit, s.index, 0, s.rows)) for s in shards]
    return assign_pieces(pieces, world_size, before=before, seed=seed, epoch=epoch)


def assign_pieces(
    pieces: Sequence[Piece],
    world_size: int,
    *,
    before: Sequence[int],
    seed: int,
    epoch: int,
) -> list[list[Span]]:
    """:func:`assign` for parts of a commit's shards (all of one commit): what a resumed
    epoch shares out (:mod:`flow.handoff.elastic`). Whole shards give :func:`assign`'s plan."""
    owned: list[list[Piece]] = [[] for _ in range(world_size)]
    for piece in pieces:
        owned[piece.bucket % world_size].append(piece)
    sequences: list[list[Span]] = []
    for owner, mine in enumerate(owned):
        commit = mine[0].span.commit if mine else 0
        order = np.random.default_rng([seed, epoch, commit, owner]).permutation(len(mine))
        sequences.append([mine[i].span for i in order if mine[i].span.rows])
    counts = [sum(s.rows for s in seq) for seq in sequences]
    wanted = targets(sum(counts), before)
    kept: list[list[Span]] = []
    pool: list[Span] = []
    for r, seq in enumerate(sequences):
        head, tail = _take(seq, min(wanted[r], counts[r]))
        kept.append(head)
        pool.extend(tail)
    for r in range(world_size):
        have = sum(s.rows for s in kept[r])
        received, pool = _take(pool, wanted[r] - have)
        kept[r].extend(received)
    return kept


def rank_totals(commits: Sequence[Sequence[ShardRef]], world_size: int) -> list[int]:
    """Rows each rank gets over ``commits`` (counts only; no permutation needed)."""
    totals = [0] * world_size
    for shards in commits:
        share = targets(sum(s.rows for s in shards), totals)
        totals = [t + s for t, s in zip(totals, share, strict=True)]
    return totals


def batch_sizes(totals: Sequence[int], rank: int, batch_size: int) -> list[int]:
    """A finite epoch's batch sizes for ``rank``: the same count on every rank, all rows once.

    Totals differ by at most one row between ranks; the last batch takes what is left (between
    1 and ``batch_size + 1`` rows).
    """
    lowest = min(totals)
    count = -(-lowest // batch_size)  # ceil
    if count == 0:
        return []
    return [batch_size] * (count - 1) + [totals[rank] - (count - 1) * batch_size]


@dataclass(frozen=True)
class Window:
    """Rows permuted together: rows carried from the previous window, then ``spans``."""

    ident: int
    carry: int
    spans: tuple[Span, ...]
    seed: tuple[int, ...]
    shuffle: bool = True

    @property
    def rows(self) -> int:
        return self.carry + sum(s.rows for s in self.spans)

    def permutation(self) -> np.ndarray:
        """The order the window's rows are read in (identity without shuffling)."""
        if not self.shuffle:
            return np.arange(self.rows)
        order: np.ndarray = np.random.default_rng(list(self.seed)).permutation(self.rows)
        return order


@dataclass(frozen=True)
class BatchPlan:
    """A batch: positions ``[start, stop)`` of its window's permuted order."""

    ordinal: int
    """Position of the batch in the rank's epoch (what a cursor counts)."""
    window: Window
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass
class RankPlanner:
    """Turns one rank's spans, commit after commit, into windows and batches.

    ``sizes`` fixes the batch sizes of a finite epoch (see :func:`batch_sizes`); without it every
    batch is ``batch_size`` rows and the remainder waits for the next commit.
    """

    rank: int
    batch_size: int
    window_rows: int
    seed: int
    epoch: int
    sizes: list[int] | None = None
    stripe: int = 8
    """How many shards a window draws its rows from at once."""
    shuffle: bool = True
    """Permute each window; without, rows keep their order (still balanced, still batched)."""
    _windows: int = 0
    _batches: int = 0
    _carry: int = 0

    def __post_init__(self) -> None:
        # With batches of one row, a rank one row ahead cannot be matched at a channel's
        # close: the ranks' batch counts could differ. Two rows leave a carried row to yield.
        if self.batch_size < 2:
            raise ConfigError(f"batch_size={self.batch_size} must be at least 2")
        if self.window_rows < self.batch_size + 1:
            raise ConfigError(
                f"window_rows={self.window_rows} must exceed batch_size={self.batch_size}; a "
                "shuffle window holds several batches (e.g. 16 x batch_size)"
            )

    @property
    def batches(self) -> int:
        return self._batches

    def counters(self) -> tuple[int, int, int]:
        """(windows, batches, carried rows): all a planner's state, for a cursor."""
        return self._windows, self._batches, self._carry

    def restore(self, counters: Sequence[int]) -> None:
        self._windows, self._batches, self._carry = (int(c) for c in counters)

    @property
    def carried(self) -> int:
        """Rows waiting for more rows to fill a batch."""
        return self._carry

    def _next_size(self) -> int | None:
        if self.sizes is None:
            return self.batch_size
        return self.sizes[self._batches] if self._batches < len(self.sizes) else None

    def add(
        self, spans: Sequence[Span], keep: int | None = None
    ) -> Iterator[tuple[Window, list[BatchPlan]]]:
        """Windows over ``spans`` (after the carried rows), each with the batches it fills.

        A window may fill no batch: its rows are then all carried into the next one. With
        ``keep`` (a following reader's whole commits, :func:`keep_of`), the last window also
        yields its rows short of a batch as one last, smaller batch, carrying only ``keep``
        rows on; without spans, the carried rows make that window alone.
        """
        rest = list(spans)
        if not rest and keep is not None and self._carry > keep:
            yield self._carried_window(keep)
        while rest:
            room = max(self.window_rows - self._carry, 1)
            head, rest = _stripe(rest, room, self.stripe)
            window = Window(
                self._windows,
                self._carry,
                tuple(head),
                (self.seed, self.epoch, self.rank, self._windows),
                self.shuffle,
            )
            self._windows += 1
            yield window, self._cut(window, None if rest else keep)

    def _cut(self, window: Window, keep: int | None = None) -> list[BatchPlan]:
        """Full batches; with ``keep``, then one of the rest but ``keep`` rows."""
        position = 0
        batches = []
        reserve = keep or 0
        while True:
            size = self._next_size()
            if size is None:
                break
            left = window.rows - position - reserve
            if left < size:
                if keep is None or left <= 0:
                    break
                size = left
            batches.append(BatchPlan(self._batches, window, position, position + size))
            self._batches += 1
            position += size
        self._carry = window.rows - position
        return batches

    def _carried_window(self, keep: int | None) -> tuple[Window, list[BatchPlan]]:
        """The carried rows as a window of their own (with ``keep``: yielded but ``keep``)."""
        seed = (self.seed, self.epoch, self.rank, self._windows)
        window = Window(self._windows, self._carry, (), seed, self.shuffle)
        self._windows += 1
        return window, self._cut(window, keep)

    def finish(self, totals: Sequence[int]) -> Iterator[tuple[Window, list[BatchPlan]]]:
        """At a followed channel's close: a last partial batch where the ranks need one.

        ``totals`` are every rank's rows over the whole channel (:func:`rank_totals`, the same on
        every rank). A rank that yielded a batch fewer than another yields its carried rows;
        if every rank at the highest count still carries rows, they all yield one more. Rows
        left after that (fewer than the world size in all) are :attr:`undelivered`.
        """
        full = [t // self.batch_size for t in totals]
        final = max(full)
        if all(t % self.batch_size > 0 for t, f in zip(totals, full, strict=True) if f == final):
            final += 1
        if self._batches < final and self._carry > 0:
            seed = (self.seed, self.epoch, self.rank, self._windows)
            window = Window(self._windows, self._carry, (), seed, self.shuffle)
            self._windows += 1
            batch = BatchPlan(self._batches, window, 0, self._carry)
            self._batches += 1
            self._carry = 0
            yield window, [batch]

    def drain(self, keep: int | None = None) -> Iterator[tuple[Window, list[BatchPlan]]]:
        """The carried rows alone, as a window cut into the batches they fill (with ``keep``,
        and one of the rest but ``keep`` rows, as :meth:`add`).

        How a re-cut epoch's rank begins (:mod:`flow.handoff.elastic`): it starts with rows
        carried, maybe more than a window's, and maybe no span of its own to mix them with.
        Windows leave fewer rows than a batch after it, as in any epoch.
        """
        if self._carry and self._next_size() is not None:
            yield self._carried_window(keep)

    @property
    def undelivered(self) -> int:
        return self._carry


def span_refs(spans: Sequence[Span]) -> np.ndarray:
    """References ``(commit, shard index, row)`` of every row of ``spans``, in order."""
    parts = [
        np.column_stack(
            [
                np.full(s.rows, s.commit, dtype=np.int64),
                np.full(s.rows, s.index, dtype=np.int64),
                np.arange(s.start, s.stop, dtype=np.int64),
            ]
        )
        for s in spans
    ]
    return np.concatenate(parts) if parts else np.empty((0, 3), dtype=np.int64)


class RowTracker:
    """Row references ``(commit, shard index, row)`` of each batch, carries followed.

    The reader does the same on data; tests and resumption use the references.
    """

    def __init__(self) -> None:
        self.carry = np.empty((0, 3), dtype=np.int64)

    def window(self, window: Window, batches: Sequence[BatchPlan]) -> list[np.ndarray]:
        """Each batch's row references; what the window leaves is carried on."""
        if len(self.carry) != window.carry:
            raise RuntimeError(f"window {window.ident} expects {window.carry} carried rows")
        refs = np.concatenate([self.carry, span_refs(window.spans)])
        ordered = refs[window.permutation()]
        out = [ordered[b.start : b.stop] for b in batches]
        self.carry = ordered[batches[-1].stop :] if batches else ordered
        return out
