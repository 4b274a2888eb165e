"""Which commits a channel should hold, told from the commits it holds: pure functions.

Every commit of format 2 records its writer, its place in that writer's sequence (``seq``: 0,
1, 2, ... with no holes, a batch with no rows included) and the batch id of the writer's commit
before it (``previous``). Each writer's head (:class:`~flow.handoff.format.WriterHead`) records
its latest commit and is written after that commit's record. So:

* a hole in a writer's ``seq`` numbers is a lost commit, and the commit after the hole names
  the batch id of the last one lost (``previous``);
* a head beyond the writer's highest ``seq`` present is a lost end of the sequence;
* a lost commit whose batch id retention has marked retired is not a gap: every consumer read
  it before it went.

Commits of format 1 (no ``seq``) are left out: gaps among them cannot be told.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass

from flow.errors import MissingCommitError
from flow.handoff.format import Commit, WriterHead

__all__ = ["MissingCommit", "find_missing"]


@dataclass(frozen=True)
class MissingCommit:
    """Commits ``first_seq..last_seq`` of ``writer`` that a channel should hold and does not."""

    channel: str
    writer: str
    first_seq: int
    last_seq: int
    batch_ids: tuple[int, ...] = ()
    """The batch ids of the missing commits where they are known (all, some or none)."""
    after: int | None = None
    """Batch id of the writer's commit just before the gap; None: unknown or none."""
    before: int | None = None
    """Batch id of the writer's commit just after the gap; None: the gap ends the sequence."""

    @property
    def seqs(self) -> tuple[int, ...]:
        return tuple(range(self.first_seq, self.last_seq + 1))

    def describe(self) -> str:
        count = self.last_seq - self.first_seq + 1
        seqs = (
            f"seq {self.first_seq}"
            if count == 1
            else f"seqs {self.first_seq}..{self.last_seq} ({count} commits)"
        )
        if not self.batch_ids:
            ids = "batch id unknown"
        elif len(self.batch_ids) == 1:
            ids = f"batch {self.batch_ids[0]}"
        else:
            ids = f"batches {', '.join(map(str, self.batch_ids))}"
        if self.before is not None and self.after is not None:
            where = f"between batches {self.after} and {self.before}"
        elif self.before is not None:
            where = f"before batch {self.before}"
        else:  # the end of the sequence: only the writer's head knows of it
            where = "although the writer's head says it was committed"
            if self.after is not None:
                where = f"after batch {self.after}, {where}"
        writer = self.writer or "(unnamed)"
        return f"writer {writer!r}: commit {seqs} ({ids}) missing, {where}"

    def error(self, advice: str = "") -> MissingCommitError:
        return MissingCommitError(
            f"channel {self.channel!r}: {self.describe()}. Reading on would train on less than "
            f"was committed{advice}; `flow handoff verify` lists every problem of the channel",
            channel=self.channel,
            writer=self.writer,
            seqs=self.seqs,
            batch_ids=self.batch_ids,
        )


_MOST_FREE = 1_000_000
"""Batch ids a gap's window may span for its free ids to be listed (else they stay unknown)."""


def _free_ids(present: list[int], low: int, high: int) -> list[int] | None:
    """The batch ids strictly between ``low`` and ``high`` that no commit holds (None: too many
    to list). A writer's lost commits are among them: its batch ids grow with ``seq``."""
    first, stop = bisect.bisect_right(present, low), bisect.bisect_left(present, high)
    if high - low - 1 - (stop - first) > _MOST_FREE:
        return None
    held = set(present[first:stop])
    return [i for i in range(low + 1, high) if i not in held]


def find_missing(
    channel: str,
    commits: Iterable[Commit],
    heads: Mapping[str, WriterHead],
    retired: Set[int] = frozenset(),
) -> list[MissingCommit]:
    """Every run of commits missing from each writer's sequence, by writer then ``seq``.

    ``heads`` must have been read before ``commits`` were listed: a head is written after its
    commit, so one read first never names a commit still being written.
    """
    every = list(commits)
    present = sorted({c.batch_id for c in every})
    by_writer: dict[str, dict[int, Commit]] = {}
    for commit in every:
        if commit.seq is not None:
            by_writer.setdefault(commit.writer, {})[commit.seq] = commit
    found: list[MissingCommit] = []
    for writer in sorted(set(by_writer) | set(heads)):
        seqs = by_writer.get(writer, {})
        head = heads.get(writer)
        top = max([*seqs, head.seq if head is not None else -1])
        seq = 0
        while seq <= top:
            if seq in seqs:
                seq += 1
                continue
            first = seq
            while seq <= top and seq not in seqs:
                seq += 1
            last = seq - 1
            gap = _gap(channel, writer, first, last, seqs, head, present, retired)
            if gap is not None:
                found.append(gap)
    return found


def _gap(
    channel: str,
    writer: str,
    first: int,
    last: int,
    seqs: Mapping[int, Commit],
    head: WriterHead | None,
    present: list[int],
    retired: Set[int],
) -> MissingCommit | None:
    """The run ``first..last`` of ``writer``'s lost commits, with what is known of their batch
    ids; None if every batch id they can have is retired (so are they)."""
    below, above = seqs.get(first - 1), seqs.get(last + 1)
    low = below.batch_id if below is not None else -1
    # A run with no commit after it ends the sequence: the head is its last commit.
    high = above.batch_id if above is not None else head.batch_id + 1 if head is not None else None
    free = _free_ids(present, low, high) if high is not None else None
    if free and all(b in retired for b in free):
        return None
    known: dict[int, int] = {}
    if free is not None and len(free) == last - first + 1:  # one writer: exactly the lost ones
        known.update(zip(range(first, last + 1), free, strict=True))
    if above is not None and above.previous is not None:
        known[last] = above.previous
    if head is not None and first <= head.seq <= last:
        known[head.seq] = head.batch_id
    return MissingCommit(
        channel,
        writer,
        first,
        last,
        tuple(known[s] for s in sorted(known)),
        after=below.batch_id if below is not None else None,
        before=above.batch_id if above is not None else None,
    )
