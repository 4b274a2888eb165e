"""Checking a channel against what its commits say it holds (``flow handoff verify``).

Four kinds of problem, each one line naming what to look at:

* **damaged**: a kept shard that is missing, truncated, not its checksum, not Arrow; or a
  commit record that cannot be parsed;
* **missing**: commits their writer's sequence says exist and that are not there (see
  :mod:`flow.handoff.sequence`; retired commits are not missing);
* **orphan**: a shard file no commit names. Shards of a batch in progress are written before its
  commit, so files of a batch above every commit and every writer's head, in an open channel,
  whose newest file is younger than ``in_flight_grace``, are *in flight*, not orphans. A batch
  that stopped before its commit, or whose commit was deleted, stops being in flight after that
  long; a closed channel has nothing in flight;
* **rows**: a shard whose row count is not the one its commit records, or a commit whose
  recorded total is not the sum of its shards.

Commits written before sequence numbers (format 1) are counted as unchecked: gaps among them
cannot be told.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pyarrow import fs as pafs

from flow.errors import ShardCorruptError
from flow.handoff.format import COMMITS, SHARDS, Commit
from flow.handoff.sequence import MissingCommit, find_missing
from flow.handoff.shards import read_shard

if TYPE_CHECKING:
    from flow.handoff.channel import Channel

__all__ = ["Problem", "ProblemKind", "VerifyReport", "verify_channel"]

ProblemKind = Literal["damaged", "missing", "orphan", "rows"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a channel."""

    kind: ProblemKind
    message: str
    batch_id: int | None = None
    path: str | None = None
    """The shard or commit file, relative to the channel folder."""


@dataclass(frozen=True)
class VerifyReport:
    """What :meth:`Channel.verify() <flow.handoff.Channel.verify>` found."""

    channel: str
    commits: int
    shards_checked: int
    problems: tuple[Problem, ...]
    missing: tuple[MissingCommit, ...]
    in_flight: tuple[str, ...]
    """Shard files of a batch still being written (not problems)."""
    unnumbered: int
    """Commits of format 1, which cannot be checked for gaps."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def count(self, kind: ProblemKind) -> int:
        if kind == "missing":  # a problem per run of lost commits: count the commits
            return sum(m.last_seq - m.first_seq + 1 for m in self.missing)
        return sum(1 for p in self.problems if p.kind == kind)

    def summary(self) -> str:
        text = (
            f"{self.shards_checked:,} shards checked in {self.commits:,} commits: "
            f"{self.count('damaged'):,} damaged, {self.count('missing'):,} missing commits, "
            f"{self.count('orphan'):,} orphan shards, {self.count('rows'):,} row count mismatches"
        )
        if self.in_flight:
            text += f"; {len(self.in_flight):,} shards of a batch in flight"
        if self.unnumbered:
            text += (
                f"; {self.unnumbered:,} commits were written before commits were numbered, so "
                "gaps among them cannot be checked"
            )
        return text


def _read_commits(channel: Channel, ids: list[int]) -> tuple[list[Commit], list[Problem]]:
    commits, problems = [], []
    for batch_id in ids:
        try:
            commits.append(channel.commit(batch_id))
        except (ValueError, TypeError, KeyError) as exc:  # not JSON, or not a commit's fields
            problems.append(
                Problem(
                    "damaged",
                    f"commit record of batch {batch_id} cannot be read: {exc}",
                    batch_id,
                    f"commits/{batch_id:020d}.json",
                )
            )
    return commits, problems


def _check_shards(
    channel: Channel, commits: list[Commit], retired: set[int]
) -> tuple[int, list[Problem]]:
    """Every kept shard read and checked; each commit's total against its shards."""
    checked, problems = 0, []
    for commit in commits:
        disagreement = commit.disagreement()
        if disagreement is not None:
            problems.append(Problem("rows", disagreement, commit.batch_id))
        if commit.batch_id in retired:
            continue
        for shard in commit.shards:
            checked += 1
            try:
                table = read_shard(
                    channel.folder, shard, verify=True, commit=commit.batch_id, check_rows=False
                )
            except ShardCorruptError as exc:
                problems.append(Problem("damaged", str(exc), commit.batch_id, shard.path))
                continue
            if table.num_rows != shard.rows:
                problems.append(
                    Problem(
                        "rows",
                        f"shard {shard.path} holds {table.num_rows:,} rows, commit "
                        f"{commit.batch_id} records {shard.rows:,}",
                        commit.batch_id,
                        shard.path,
                    )
                )
    return checked, problems


def _shard_files(channel: Channel) -> dict[int, list[pafs.FileInfo]]:
    """Shard files on disk, by the batch id of their folder."""
    root = channel.folder.child(SHARDS)
    found: dict[int, list[pafs.FileInfo]] = {}
    for name in root.list(folders=True):
        if not name.isdigit():
            continue
        selector = pafs.FileSelector(f"{root.path}/{name}", recursive=False)
        files = [
            info
            for info in channel.folder.fs.get_file_info(selector)
            if info.type == pafs.FileType.File and not info.base_name.startswith(".")
        ]
        found[int(name)] = sorted(files, key=lambda f: f.base_name)
    return found


def _orphans(
    channel: Channel,
    commits: list[Commit],
    newest: int,
    missing: list[MissingCommit],
    in_flight_grace: float,
    now: float,
) -> tuple[list[Problem], list[str]]:
    named = {s.path for c in commits for s in c.shards}
    committed = {c.batch_id for c in commits}
    lost = {b for m in missing for b in m.batch_ids}
    closed = channel.closed()
    problems, in_flight = [], []
    for batch_id, files in sorted(_shard_files(channel).items()):
        loose = [f for f in files if f"{SHARDS}/{batch_id:020d}/{f.base_name}" not in named]
        if not loose:
            continue
        ages = [now - f.mtime.timestamp() for f in files if f.mtime is not None]
        if batch_id > newest and not closed and (not ages or min(ages) < in_flight_grace):
            in_flight += [f"{SHARDS}/{batch_id:020d}/{f.base_name}" for f in loose]
            continue
        if batch_id in committed:
            why = "left by a failed or speculative task attempt; readers never read it"
        elif batch_id in lost:
            why = "its commit is missing: see above"
        else:
            why = (
                f"batch {batch_id} has no commit: its writer stopped before committing it, or "
                "its commit record was deleted"
            )
        for f in loose:
            path = f"{SHARDS}/{batch_id:020d}/{f.base_name}"
            problems.append(
                Problem(
                    "orphan", f"orphan shard {path}: no commit names it ({why})", batch_id, path
                )
            )
    return problems, in_flight


def verify_channel(
    channel: Channel,
    *,
    in_flight_grace: float = 3600.0,
    clock: Callable[[], float] = time.time,
) -> VerifyReport:
    """Check ``channel`` (see the module docstring); ``clock`` gives the time shards' ages are
    measured at."""
    heads = channel.heads()  # before listing commits: a head never names one in progress
    listed = [int(n.removesuffix(".json")) for n in channel.folder.child(COMMITS).list(".json")]
    channel.log.load()
    folded = [b for b in channel.log.ids() if b not in set(listed)]
    ids = sorted([*listed, *folded])
    retired = channel.retired_ids()
    commits, problems = _read_commits(channel, listed)
    # Commits whose record retention deleted: the checkpoint holds them (and their sequence).
    commits += [c for c in map(channel.log.commit, folded) if c is not None]
    checked, shard_problems = _check_shards(channel, commits, retired)
    missing = find_missing(channel.name, commits, heads, retired)
    newest = max([*ids, *(h.batch_id for h in heads.values())], default=-1)
    orphans, in_flight = _orphans(channel, commits, newest, missing, in_flight_grace, clock())
    gaps = [
        Problem("missing", m.describe(), m.batch_ids[-1] if m.batch_ids else None) for m in missing
    ]
    return VerifyReport(
        channel=channel.name,
        commits=len(ids),
        shards_checked=checked,
        problems=(*problems, *shard_problems, *gaps, *orphans),
        missing=tuple(missing),
        in_flight=tuple(in_flight),
        unnumbered=sum(1 for c in commits if not c.numbered),
    )
