"""The commit log at length: checkpoints, heads, retention that shrinks it, old channels."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flow.errors import MissingCommitError
from flow.handoff import (
    Channel,
    ChannelReader,
    Commit,
    ConsumerPosition,
    ReadOptions,
    World,
    every_rank,
)
from flow.handoff import log as commit_log
from flow.handoff.format import WriterHead, commit_name, head_name
from flow.handoff.plan import targets
from flow.storage import Location, counting_location
from tests.support import Writer, read_ids


@pytest.fixture(autouse=True)
def small_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoints every 4 commits, segments merged every 3: every path taken in a few."""
    monkeypatch.setattr(commit_log, "CHECKPOINT_INTERVAL", 4)
    monkeypatch.setattr(commit_log, "MERGE_SEGMENTS", 3)


def folder(w: Writer) -> Path:
    return Path(w.channel.folder.path)


def rows(where: Path, name: str = "live", **options: object) -> list[int]:
    reader = ChannelReader(
        str(where),
        name,
        options=ReadOptions(batch_size=8, **options),  # type: ignore[arg-type]
    )
    return [i for batch in read_ids(reader) for i in batch]


def long_channel(tmp_path: Path, commits: int = 30) -> tuple[Writer, list[int]]:
    w = Writer(tmp_path, "live", buckets=2, writer="ctr.live:a")
    written: list[int] = []
    for k in range(commits):
        written += w.commit([3 + k % 4, 2])
    return w, written


def test_a_reader_from_a_checkpoint_reads_what_a_reader_of_the_full_log_reads(
    tmp_path: Path,
) -> None:
    w, written = long_channel(tmp_path)
    checkpoint = commit_log.read_checkpoint(w.channel.folder)
    assert checkpoint is not None
    assert checkpoint.commits == 28  # seven folds of four; two commits after the last
    assert any(s["level"] == 1 for s in checkpoint.segments)  # three segments merged
    from_checkpoint = rows(tmp_path, shuffle=True, seed=3)
    shutil.rmtree(folder(w) / "log")  # the same channel read as an old one: by its records
    assert rows(tmp_path, shuffle=True, seed=3) == from_checkpoint
    assert sorted(from_checkpoint) == written


def test_add_commit_and_an_idle_poll_never_list_the_commits(tmp_path: Path) -> None:
    w, _ = long_channel(tmp_path, 9)
    where, calls = counting_location(str(tmp_path))
    channel = Channel(where, "live")
    meta = w.channel.meta()
    shard = w.channel.write_bucket(9, 0, w.channel.meta().schema.empty_table(), "t")
    channel._writing_checkpoint()  # a writer reads the checkpoint once, not per commit
    calls.calls.clear()
    channel.add_commit(Commit("live", 9, (shard,), meta.fingerprint, writer="ctr.live:a"))
    # exists(record), shard info, head, one probe, claim + record + head writes (+ renames),
    # the batch folder's listing (failed attempts): never the commits folder.
    assert calls.calls.get("list", 0) == 1
    assert calls.total() <= 16, calls.calls
    reader = ChannelReader(where, "live", options=ReadOptions(batch_size=8, follow=True))
    polls: list[dict[str, int]] = []

    def pause(_: float) -> None:
        polls.append(dict(calls.calls))
        if len(polls) == 4:
            raise KeyboardInterrupt

    reader.sleep = pause
    with pytest.raises(KeyboardInterrupt):
        for _ in reader:
            pass
    idle = {k: polls[3].get(k, 0) - polls[2].get(k, 0) for k in polls[3]}
    # One LIST of writers/ (heads and the close) and one GET of the one writer's head.
    assert sum(idle.values()) <= 2, idle


def _idle_requests(where: Location, before_each_poll: Callable[[int], object]) -> int:
    """Requests of a follower's idle poll, after ``before_each_poll(n)`` ran before its polls
    1..5 (commits land there); the poll measured is the seventh, when nothing came since."""
    handler = where.fs.handler
    reader = ChannelReader(where, "live", options=ReadOptions(batch_size=4, follow=True))
    totals: list[int] = []

    def pause(_: float) -> None:
        totals.append(handler.total())
        if len(totals) == 8:
            raise KeyboardInterrupt
        before_each_poll(len(totals))

    reader.sleep = pause
    with pytest.raises(KeyboardInterrupt):
        for _ in reader:
            pass
    return totals[7] - totals[6]


def test_a_follower_started_before_the_first_commit_reads_heads_not_listings(
    tmp_path: Path,
) -> None:
    # A trainer started beside its live stage opens the channel before any commit: it too must
    # learn of commits from the heads, not by listing commits/ every poll (flow bench soak).
    w = Writer(tmp_path, "live", buckets=2, writer="ctr.live:a")
    where, _ = counting_location(str(tmp_path))
    assert _idle_requests(where, lambda n: n <= 5 and bool(w.commit([3, 2]))) <= 2


def test_a_follower_of_an_old_channel_reads_heads_once_it_is_upgraded(tmp_path: Path) -> None:
    w, _ = long_channel(tmp_path, 3)
    shutil.rmtree(folder(w) / "log")  # as written before checkpoints
    fresh = Writer.__new__(Writer)
    fresh.__dict__.update(w.__dict__, channel=Channel(str(tmp_path), "live"))
    where, _ = counting_location(str(tmp_path))
    # The follower starts on the old channel; the first write of this version upgrades it.
    assert _idle_requests(where, lambda n: n in (2, 3) and bool(fresh.commit([2]))) <= 2


def test_a_long_follower_holds_a_bounded_tail_and_reads_every_row_once(tmp_path: Path) -> None:
    # A trainer follows for weeks: its view must not keep every commit it has seen as records
    # (flow bench soak: +44 MB and +0.2 ms an idle poll a thousand commits of 64 shards).
    w = Writer(tmp_path, "live", buckets=2, writer="ctr.live:a")
    written: list[int] = []
    reader = ChannelReader(
        str(tmp_path), "live", options=ReadOptions(batch_size=4, follow=True, shuffle=False)
    )
    held: list[int] = []

    def pause(_: float) -> None:
        held.append(reader.channel.log.records_held)
        if len(held) <= 40:
            written.extend(w.commit([3, 2]))
        elif len(held) == 41:
            w.channel.close()

    reader.sleep = pause
    read = [i for batch in read_ids(reader) for i in batch]
    assert sorted(read) == written
    interval = commit_log.CHECKPOINT_INTERVAL
    assert max(held) <= 2 * interval + 1, held  # reloaded from the checkpoint as it grows


def test_segments_no_recent_checkpoint_names_are_deleted_once_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w, written = long_channel(tmp_path, 12)  # folds and a merge: segments merged away
    segments = folder(w) / "log" / "segments"
    made = {p.name for p in segments.iterdir()}
    first = commit_log.read_checkpoint(w.channel.folder)
    assert first is not None
    named = {s["name"] for s in first.segments}
    assert made - named  # what the merge left (young: kept, a reader may be reading it)
    monkeypatch.setattr(commit_log, "SEGMENT_GRACE_S", 0.0)
    written += w.commit([3, 2]) + w.commit([3, 2]) + w.commit([3, 2]) + w.commit([3, 2])
    checkpoint = commit_log.read_checkpoint(w.channel.folder)
    assert checkpoint is not None
    kept = {p.name for p in segments.iterdir()}
    # The last two checkpoints' segments only: a reader of the one before may still read them.
    assert len(kept) <= len(checkpoint.segments) + 1
    assert {s["name"] for s in checkpoint.segments} <= kept
    assert sorted(rows(tmp_path)) == written


def test_a_replayed_batch_is_a_no_op_after_a_checkpoint_and_after_retention(
    tmp_path: Path,
) -> None:
    w, _ = long_channel(tmp_path, 10)
    first = w.channel.commit(1)
    assert w.channel.add_commit(first) is None
    w.channel.record(ConsumerPosition("t", 0, 1, 5, "2026-01-01T00:00:00+00:00"))
    assert w.channel.retire() > 0
    assert not (folder(w) / "commits" / commit_name(1)).exists()
    assert w.channel.add_commit(first) is None  # its record is gone: the checkpoint knows it
    assert w.channel.verify().ok


def test_a_writer_stopped_between_record_and_head_goes_on_after_it(tmp_path: Path) -> None:
    w, written = long_channel(tmp_path, 6)
    head_file = folder(w) / "writers" / head_name("ctr.live:a")
    stale = head_file.read_text()
    written += w.commit([5])  # batch 6, seq 6
    head_file.write_text(stale)  # as if the writer stopped before its head
    # A claim with no record (stopped before the record) is taken over, not a commit.
    commit_log.claim(w.channel.folder, "ctr.live:a", 7, 99)
    fresh = Writer.__new__(Writer)
    fresh.__dict__.update(w.__dict__, channel=Channel(str(tmp_path), "live"))
    written += fresh.commit([4])
    seven = fresh.channel.commit(7)
    assert (seven.seq, seven.previous) == (7, 6)
    # A replay of the batch whose head was lost repairs the head: followers see it.
    head_file.write_text(stale)
    assert fresh.channel.add_commit(fresh.channel.commit(6)) is None
    head = WriterHead.from_json(head_file.read_text())
    assert head.seq == 6 or head.seq == 7
    fresh.channel.close()
    assert sorted(rows(tmp_path, follow=True)) == written
    assert fresh.channel.verify().ok


def test_retention_folds_and_deletes_records_shards_and_claims(tmp_path: Path) -> None:
    w, written = long_channel(tmp_path, 12)
    w.channel.record(ConsumerPosition("t", 0, 1, 7, "2026-01-01T00:00:00+00:00"))
    freed = w.channel.retire()
    assert freed > 0
    left = sorted(int(p.stem) for p in (folder(w) / "commits").glob("*.json"))
    assert left == list(range(8, 12))
    assert not any((folder(w) / "shards" / f"{b:020d}").exists() for b in range(8))
    claims = next((folder(w) / "log" / "seqs").iterdir())
    assert sorted(int(p.name) for p in claims.iterdir()) == list(range(8, 12))
    assert w.channel.retired(7)
    assert not w.channel.retired(8)
    assert w.channel.retire() == 0  # nothing new: nothing written
    report = w.channel.verify()
    assert report.ok, report.problems
    assert report.commits == 12
    # A reader after what was retired reads the rest.
    kept = sum(3 + k % 4 + 2 for k in range(8, 12))
    assert sorted(rows(tmp_path, after_commit=7)) == written[-kept:]


def test_verify_finds_a_gap_across_a_checkpoint(tmp_path: Path) -> None:
    w, _ = long_channel(tmp_path, 10)  # folded up to seq 7; 8 and 9 are records
    (folder(w) / "commits" / commit_name(8)).unlink()
    report = w.channel.verify()
    (missing,) = report.missing
    assert (missing.seqs, missing.batch_ids) == ((8,), (8,))
    with pytest.raises(MissingCommitError):
        rows(tmp_path)
    # A fold does not fold past the gap: the lost commit stays a gap, not a forgotten number.
    commit_log.fold(w.channel.folder)
    assert Channel(str(tmp_path), "live").verify().count("missing") == 1


def test_exact_and_elastic_resume_across_a_checkpoint(tmp_path: Path) -> None:
    w, written = long_channel(tmp_path, 6)
    options = ReadOptions(batch_size=4, window_rows=12, seed=1)
    readers = [ChannelReader(str(tmp_path), "live", world=World(r, 2), options=options)
               for r in range(2)]  # fmt: skip
    its = [iter(r) for r in readers]
    seen = [i for it in its for _ in range(3) for i in next(it).column("id").to_pylist()]
    cursors = [r.state_dict() for r in readers]
    for _ in range(8):  # more commits, and two checkpoints, after the cursors were taken
        written += w.commit([3, 3])
    # Exact: the same world goes on from each cursor.
    again = ChannelReader(str(tmp_path), "live", world=World(0, 2), options=options)
    again.load_state_dict(cursors[0])
    assert again.state_dict()["after"] == cursors[0]["after"]
    # Elastic: one rank finishes what two had not read, every row once.
    one = ChannelReader(str(tmp_path), "live", world=World(0, 1), options=options)
    one.load_state_dict(every_rank(cursors))
    rest = [i for batch in one for i in batch.column("id").to_pylist()]
    upto = cursors[0]["upto"]
    first_epoch = [i for i in written if i < sum(3 + k % 4 + 2 for k in range(upto + 1))]
    assert sorted(seen + rest) == first_epoch


def test_an_old_channel_is_read_and_upgraded_on_its_first_write(tmp_path: Path) -> None:
    w, written = long_channel(tmp_path, 6)
    shutil.rmtree(folder(w) / "log")  # as written before checkpoints
    assert sorted(rows(tmp_path)) == written
    fresh = Writer.__new__(Writer)
    fresh.__dict__.update(w.__dict__, channel=Channel(str(tmp_path), "live"))
    written += fresh.commit([2])
    checkpoint = commit_log.read_checkpoint(fresh.channel.folder)
    assert checkpoint is not None
    assert checkpoint.commits == 6
    assert fresh.channel.commit(6).seq == 6  # numbered on from the old commits
    assert sorted(rows(tmp_path)) == written
    assert fresh.channel.verify().ok


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 9), st.lists(st.integers(0, 50), max_size=30), st.integers(0, 40))
def test_rank_totals_follow_from_the_sum_of_rows(size: int, commits: list[int], carry: int) -> None:
    """What lets a reader plan a million commits from one sum (ChannelReader._plan_totals)."""
    totals = targets(carry, [0] * size)
    for rows_ in commits:
        totals = [t + s for t, s in zip(totals, targets(rows_, totals), strict=True)]
    total = carry + sum(commits)
    assert totals == [total // size + (1 if r < total % size else 0) for r in range(size)]


def _log_bytes(w: Writer) -> int:
    """The segments and checkpoint a reader starting now loads."""
    checkpoint = commit_log.read_checkpoint(w.channel.folder)
    assert checkpoint is not None
    log = folder(w) / "log"
    names: list[str] = [s["name"] for s in checkpoint.segments]
    return (log / "_checkpoint.json").stat().st_size + sum(
        (log / "segments" / n).stat().st_size for n in names
    )


def test_retired_commits_leave_no_shard_list_in_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # flow bench soak: a retired commit kept its shard list (64 shards: ~7.8 KB) in the
    # segments, which every new reader loads; retention must bound the log by what is unretired.
    monkeypatch.setattr(commit_log, "SEGMENT_GRACE_S", 0.0)
    buckets = 32
    w = Writer(tmp_path, "live", buckets=buckets, writer="ctr.live:a")
    written: list[int] = []
    sizes: dict[int, int] = {}

    def go_on(commits: int) -> None:
        for _ in range(commits):
            written.extend(w.commit([1] * buckets))
            if w.batch % 5 == 0:  # the consumer read it all; the writer's retention runs
                position = ConsumerPosition("t", 0, 1, w.batch - 1, "2026-01-01T00:00:00+00:00")
                w.channel.record(position)
                w.channel.retire()
        sizes[w.batch] = _log_bytes(w)

    go_on(30)
    # A checkpoint written before segments said their last commit: read once, then thinned.
    path = folder(w) / "log" / "_checkpoint.json"
    old = commit_log.Checkpoint.from_json(path.read_text())
    bare = tuple({k: s[k] for k in ("name", "commits", "level")} for s in old.segments)
    path.write_text(commit_log.Checkpoint(bare, old.heads, old.commits, old.retired_upto).to_json())
    go_on(30)
    go_on(60)
    written.extend(w.commit([2] * buckets))  # batch 120: not retired, a record
    shard_list = len(json.dumps([asdict(s) for s in w.channel.commit(120).shards]))
    per_commit = (sizes[120] - sizes[60]) / 60  # ~ the shard list a commit before
    assert per_commit < shard_list / 4, (sizes, shard_list)  # 300-400 B: the record's JSON
    checkpoint = commit_log.read_checkpoint(w.channel.folder)
    assert checkpoint is not None
    assert checkpoint.retired_upto == 119
    assert all(s.get("retired") for s in checkpoint.segments)
    # What a retired commit is still asked for: its rows (a stage's totals), writer, sequence.
    channel = Channel(str(tmp_path), "live")
    ids = channel.commit_ids()
    assert ids == list(range(121))
    assert sum(channel.commit(b).rows for b in ids) == len(written)
    assert channel.commit(7).writer == "ctr.live:a"
    assert channel.commit(7).seq == 7
    report = channel.verify()
    assert report.ok, report.problems
    assert report.commits == 121
    # Readers after the retired range, from the checkpoint and following, read what came after.
    written.extend(w.commit([3] * buckets))
    after = written[-5 * buckets :]
    assert sorted(rows(tmp_path, after_commit=119)) == after
    w.channel.close()
    assert sorted(rows(tmp_path, after_commit=119, follow=True)) == after
