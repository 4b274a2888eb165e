"""When a following reader picked each commit up, and which commits a window's rows came from.

A commit is *picked up* by the poll that first lists it (its end: the listing's cost and the
poll interval both fall before it). Against the commit's ``committed_at`` this is the follower's
own delay; against the wall clock when a batch is trained on, the trainer's (reading the shards,
filling the shuffle window, its queue and the step).

The reader keeps one :class:`PickUp` per commit it read (the latest :data:`KEPT`: a follower
runs for weeks) and, for each shuffle window it cuts, an :class:`Origin`: the commits of the
window's rows, with how many rows each gave. A batch is a uniform sample of its window (the
window is permuted as a whole), so its window's mix of commits is its own in expectation; that
is what a batch reports, without any per-row work.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from flow.handoff.format import Commit
from flow.handoff.plan import Span

__all__ = ["KEPT", "Origin", "PickUp", "PickUps"]

KEPT = 4096
"""Commits whose pick-up a reader remembers (the latest): more than a shuffle window spans."""


@dataclass(frozen=True)
class PickUp:
    """One commit, as a following reader found it (times in seconds since the epoch)."""

    batch_id: int
    rows: int
    """The commit's rows (all buckets)."""
    committed_s: float
    """Its ``committed_at``, from the writer's clock."""
    found_s: float
    """The end of the poll that first listed it, from the reader's clock."""

    @property
    def waited_s(self) -> float:
        """Committed -> picked up: seconds the commit waited for the follower to see it."""
        return self.found_s - self.committed_s


@dataclass(frozen=True)
class Origin:
    """The commits one shuffle window's rows came from, for the batches cut from it."""

    commits: tuple[PickUp, ...]
    rows: tuple[int, ...]
    """Rows of each commit in the window (carried rows included)."""
    ready_s: float
    """When the window's rows had been read and cut into batches (the reader's clock)."""


class PickUps:
    """The pick-ups of the latest :data:`KEPT` commits a following reader read, by batch id."""

    def __init__(self, kept: int = KEPT) -> None:
        self.kept = kept
        self._by_id: dict[int, PickUp] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, batch_id: int) -> PickUp | None:
        return self._by_id.get(batch_id)

    def add(self, commit: Commit, found_s: float) -> PickUp:
        """Remember ``commit``, listed by the poll that ended at ``found_s`` (a commit already
        known keeps its first pick-up: a resumed walk lists it again)."""
        known = self._by_id.get(commit.batch_id)
        if known is not None:
            return known
        committed = datetime.fromisoformat(commit.committed_at).timestamp()
        found = self._by_id[commit.batch_id] = PickUp(
            commit.batch_id, commit.rows, committed, found_s
        )
        while len(self._by_id) > self.kept:
            del self._by_id[next(iter(self._by_id))]  # insertion order: the oldest first
        return found

    def origin(self, spans: Iterable[Span], carried: np.ndarray, ready_s: float) -> Origin:
        """The commits of a window of ``spans`` and ``carried`` rows' references (commit, shard,
        row), those this reader remembers, with their rows in the window."""
        rows: dict[int, int] = {}
        if len(carried):
            ids, counts = np.unique(carried[:, 0], return_counts=True)
            rows = dict(zip(ids.tolist(), counts.tolist(), strict=True))
        for span in spans:
            rows[span.commit] = rows.get(span.commit, 0) + span.rows
        known = [(self._by_id[b], n) for b, n in sorted(rows.items()) if b in self._by_id]
        return Origin(tuple(p for p, _ in known), tuple(n for _, n in known), ready_s)
