"""The handoff reader on real shard files (no Spark): every row once, resumable, followable."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flow.handoff.materialize as materialize_module
import flow.handoff.shards as shards_module
from flow.errors import (
    ChannelNotFoundError,
    ConfigError,
    HandoffError,
    SchemaMismatchError,
    ShardCorruptError,
)
from flow.handoff import Channel, ChannelReader, ReadOptions, World
from flow.handoff.shards import codec
from tests.support import NUMBERED, Writer, read_ids


def test_ranks_read_every_row_once_in_equal_batches(tmp_path: Path) -> None:
    w = Writer(tmp_path, "c", buckets=4)
    written = w.commit([300, 120, 77, 513, 5]) + w.commit([1000, 1, 64, 64])
    options = ReadOptions(batch_size=64, window_rows=512, seed=7)
    per_rank = [
        read_ids(ChannelReader(str(tmp_path), "c", world=World(r, 4), options=options))
        for r in range(4)
    ]
    assert len({len(b) for b in per_rank}) == 1
    assert Counter(i for rank in per_rank for b in rank for i in b) == Counter(written)


def test_epochs_reshuffle_and_seeds_decide(tmp_path: Path) -> None:
    w = Writer(tmp_path, "c")
    w.commit([500, 500, 500, 500])
    reader = ChannelReader(str(tmp_path), "c", options=ReadOptions(batch_size=100, seed=1))
    first, second = read_ids(reader), read_ids(reader)
    assert first != second
    assert sorted(i for b in first for i in b) == sorted(i for b in second for i in b)
    again = ChannelReader(str(tmp_path), "c", options=ReadOptions(batch_size=100, seed=1))
    assert read_ids(again) == first
    assert reader.stats.shards_per_batch > 1


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(stop=st.integers(0, 60), follow=st.booleans(), world_size=st.sampled_from([1, 2]))
def test_a_resumed_reader_continues_with_exactly_the_remaining_batches(
    tmp_path_factory: pytest.TempPathFactory, stop: int, follow: bool, world_size: int
) -> None:
    root = tmp_path_factory.mktemp("resume")
    w = Writer(root, "c", buckets=4)
    for sizes in ([210, 90, 333], [17], [400, 400, 12, 7], [64, 65]):
        w.commit(sizes)
    if follow:
        w.channel.close()
    options = ReadOptions(batch_size=32, window_rows=200, seed=3, follow=follow)
    for rank in range(world_size):
        world = World(rank, world_size)
        uninterrupted = ChannelReader(str(root), "c", world=world, options=options)
        reference = read_ids(uninterrupted) + read_ids(uninterrupted)  # epochs 0 and 1
        first = ChannelReader(str(root), "c", world=world, options=options)
        head = read_ids(first, limit=stop) if stop else []
        second = ChannelReader(str(root), "c", world=world, options=options)
        second.load_state_dict(first.state_dict())
        # Two more passes cover every case: stopped inside epoch 0, right after its last batch
        # (the next pass is empty) or after it ended (the cursor is at epoch 1).
        resumed = head + read_ids(second) + read_ids(second)
        assert resumed[: len(reference)] == reference


def test_background_decoding_changes_nothing(tmp_path: Path) -> None:
    """Threads (prefetch > 0) open and decode shards ahead: same batches, same cursors."""
    w = Writer(tmp_path, "c", buckets=4)
    for sizes in ([210, 90, 333, 50], [17], [400, 400, 12, 7]):
        w.commit(sizes)

    def batches_and_cursors(prefetch: int) -> list[tuple[list[int], dict[str, object]]]:
        options = ReadOptions(batch_size=32, window_rows=100, seed=5, prefetch=prefetch)
        reader = ChannelReader(str(tmp_path), "c", options=options)
        return [
            (batch.column("id").to_pylist(), reader.state_dict())
            for _ in range(2)  # two epochs
            for batch in reader
        ]

    inline = batches_and_cursors(0)
    assert len(inline) > 2 * 1500 // 100  # many windows, their shards decoded ahead
    assert batches_and_cursors(8) == inline


def test_following_reads_commits_as_they_land_and_ends_when_closed(tmp_path: Path) -> None:
    w = Writer(tmp_path, "live", buckets=2)
    written: list[int] = []
    got: list[int] = []
    # What the producer does each time the reader finds nothing new and pauses.
    producer = [
        lambda: written.extend(w.commit([120, 80])),
        lambda: written.extend(w.commit([33, 17])),
        w.channel.close,
    ]
    read_when_paused: list[int] = []

    def pause(seconds: float) -> None:
        assert seconds == 0.05  # the poll interval
        read_when_paused.append(len(got))
        producer.pop(0)()

    options = ReadOptions(batch_size=50, follow=True)
    for batch in ChannelReader(str(tmp_path), "live", options=options, sleep=pause):
        got.extend(batch.column("id").to_pylist())
    assert not producer  # the reader waited for each commit and ended at the close
    assert read_when_paused == [0, 200, 250]  # each commit's full batches before the next
    assert sorted(got) == written  # one rank: everything, including the last partial batch


def test_a_follower_reads_each_commit_whole_before_waiting_for_the_next(tmp_path: Path) -> None:
    """Whole commits (the default): a commit's rows short of a batch are not kept waiting for
    the next commit, which at a live stage's trigger would add a trigger to their freshness."""
    w = Writer(tmp_path, "live", buckets=2)
    written = w.commit([70, 45])
    producer = [lambda: written.extend(w.commit([3, 9])), w.channel.close]
    sizes: list[int] = []
    read_when_paused: list[int] = []

    def pause(_: float) -> None:
        read_when_paused.append(sum(sizes))
        producer.pop(0)()

    options = ReadOptions(batch_size=50, window_rows=80, follow=True)
    for batch in ChannelReader(str(tmp_path), "live", options=options, sleep=pause):
        sizes.append(batch.num_rows)
    assert read_when_paused == [115, 127]  # every row of each commit before the next poll
    assert sizes == [50, 50, 15, 12]
    # With full batches, the rows short of one waited: 100 rows, then 127 at the close.
    reader = ChannelReader(str(tmp_path), "live", options=replace(options, whole_commits=False))
    assert [len(b) for b in read_ids(reader)] == [50, 50, 27]


def test_a_whole_commit_follower_resumes_inside_a_commit(tmp_path: Path) -> None:
    w = Writer(tmp_path, "live", buckets=3)
    written = w.commit([70, 45, 33]) + w.commit([21, 5]) + w.commit([64, 1, 90])
    w.channel.close()
    options = ReadOptions(batch_size=16, window_rows=40, follow=True)
    first = ChannelReader(str(tmp_path), "live", options=options)
    batches = iter(first)
    read = [i for _ in range(5) for i in next(batches).column("id").to_pylist()]
    again = ChannelReader(str(tmp_path), "live", options=options)
    again.load_state_dict(first.state_dict())
    rest = [i for batch in read_ids(again) for i in batch]
    assert sorted(read + rest) == written
    # A cursor of full batches (or of a version before whole commits) resumes only as it was.
    full = ReadOptions(batch_size=16, window_rows=40, follow=True, whole_commits=False)
    old = ChannelReader(str(tmp_path), "live", options=full)
    next(iter(old))
    with pytest.raises(ConfigError, match="resume with the same channel, world and read"):
        ChannelReader(str(tmp_path), "live", options=options).load_state_dict(old.state_dict())
    ChannelReader(str(tmp_path), "live", options=full).load_state_dict(old.state_dict())


def test_a_follower_records_when_it_picked_each_commit_up_and_which_a_batch_came_from(
    tmp_path: Path,
) -> None:
    """Each commit's pick-up (the poll that listed it) lies between its commit and the delivery
    of the batches it went into; each batch names its window's commits (flow.handoff.pickup)."""
    w = Writer(tmp_path, "live", buckets=2)
    w.commit([120, 80])
    producer = [lambda: w.commit([33, 17]), lambda: w.commit([300, 1]), w.channel.close]

    def pause(_: float) -> None:
        producer.pop(0)()

    options = ReadOptions(batch_size=50, window_rows=150, follow=True)
    reader = ChannelReader(str(tmp_path), "live", options=options, sleep=pause)
    seen: dict[int, float] = {}
    for batch in reader:
        delivered = time.time()
        origin = reader.origin
        assert origin is not None
        assert origin.commits
        assert sum(origin.rows) >= batch.num_rows  # the window the batch is a sample of
        for pickup in origin.commits:
            assert pickup.committed_s <= pickup.found_s <= origin.ready_s <= delivered
            assert seen.setdefault(pickup.batch_id, pickup.found_s) == pickup.found_s
        ids = batch.column("id").to_pylist()
        commits = {0 if i < 200 else 1 if i < 250 else 2 for i in ids}
        assert commits <= {p.batch_id for p in origin.commits}
    assert sorted(seen) == [0, 1, 2]
    first = [reader.pickups.get(b) for b in range(3)]
    assert [p.rows for p in first if p is not None] == [200, 50, 301]
    # Found by successive polls: a commit that landed later was picked up later.
    assert seen[0] <= seen[1] <= seen[2]


def test_a_reader_that_does_not_follow_records_no_pickups(tmp_path: Path) -> None:
    Writer(tmp_path, "c").commit([100, 100])
    reader = ChannelReader(str(tmp_path), "c", options=ReadOptions(batch_size=50))
    assert read_ids(reader)
    assert reader.origin is None
    assert not len(reader.pickups)


def test_the_next_commits_shards_are_decoded_while_this_ones_batches_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a commit's last windows the next commit's first shards are already on their way.

    Otherwise the gather waited for them at every commit: with 50k-row commits (Structured
    Streaming's micro-batches) that cost a quarter of the reader's throughput.
    """
    w = Writer(tmp_path, "c", buckets=2)
    w.commit([256, 256])
    w.commit([256, 256])
    next_commit_opened = threading.Event()
    real = shards_module.read_shard

    def spy(*args: Any, **kwargs: Any) -> pa.Table:
        if kwargs["commit"] == 1:
            next_commit_opened.set()
        return real(*args, **kwargs)

    monkeypatch.setattr(materialize_module, "read_shard", spy)
    options = ReadOptions(batch_size=32, window_rows=128, shuffle=False, prefetch=8)
    batches = iter(ChannelReader(str(tmp_path), "c", options=options))
    first = next(batches)  # commit 0 has four windows: three are still to come
    assert first.column("id")[0].as_py() < 512
    assert next_commit_opened.wait(timeout=60), "commit 1 was not opened ahead"
    rest = [i for b in batches for i in b.column("id").to_pylist()]
    assert sorted(first.column("id").to_pylist() + rest) == list(range(1024))


def test_prefetch_is_bounded_in_windows_of_rows_not_in_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window of small shards (streaming micro-batches) has the next window's shards coming."""
    w = Writer(tmp_path, "c", buckets=64)
    w.commit([8] * 64)  # four windows of 16 shards
    opened: set[int] = set()
    two_windows = threading.Event()
    real = shards_module.read_shard

    def spy(channel: Any, info: Any, **kwargs: Any) -> pa.Table:
        opened.add(info.bucket)
        if len(opened) >= 32:
            two_windows.set()
        return real(channel, info, **kwargs)

    monkeypatch.setattr(materialize_module, "read_shard", spy)
    options = ReadOptions(batch_size=32, window_rows=128, shuffle=False, prefetch=1)
    batches = iter(ChannelReader(str(tmp_path), "c", options=options))
    next(batches)
    assert two_windows.wait(timeout=60), f"only {len(opened)} shards opened, not 2 windows'"
    assert len(opened) <= 33  # this window's 16, the next one's, and one shard over at most
    assert sum(b.num_rows for b in batches) == 512 - 32


@pytest.mark.parametrize("compression", [None, "lz4"])  # mapped in place / read and decoded
def test_a_corrupted_or_truncated_shard_is_reported_with_its_path(
    tmp_path: Path, compression: str | None
) -> None:
    w = Writer(tmp_path, "c", compression=compression)
    w.commit([100, 100])
    shard = tmp_path / "c" / w.channel.commit(0).shards[1].path
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardCorruptError, match=rf"{shard.name}.*does not match its checksum"):
        read_ids(ChannelReader(str(tmp_path), "c", options=ReadOptions(batch_size=10)))
    shard.write_bytes(bytes(data[:100]))
    with pytest.raises(ShardCorruptError, match=rf"{shard.name}.*truncated"):
        read_ids(ChannelReader(str(tmp_path), "c", options=ReadOptions(batch_size=10)))


@pytest.mark.parametrize(("compression", "level"), [("lz4", -8), ("lz4", 9), ("zstd", -5)])
def test_a_channel_writes_every_shard_with_its_codec_and_level(
    tmp_path: Path, compression: str, level: int
) -> None:
    w = Writer(tmp_path, "c", compression=compression, level=level)
    written = w.commit([300, 120, 77])
    meta = Channel(str(tmp_path), "c").meta()
    assert (meta.compression, meta.compression_level) == (compression, level)
    made = codec(compression, level)  # what write_shard uses
    assert made is not None
    assert made.compression_level == level
    ids = read_ids(ChannelReader(str(tmp_path), "c", options=ReadOptions(batch_size=50)))
    assert sorted(i for b in ids for i in b) == written


def test_a_bad_codec_level_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    channel = Channel(str(tmp_path), "c")
    with pytest.raises(HandoffError, match=r"compression_level=13 is out of range for lz4: use"):
        channel.create(NUMBERED, num_buckets=2, compression="lz4", compression_level=13)
    with pytest.raises(HandoffError, match=r"compression_level=3 needs a compression"):
        channel.create(NUMBERED, num_buckets=2, compression=None, compression_level=3)
    assert not channel.exists()
    defaults = {"lz4": -1, "zstd": pa.Codec.default_compression_level("zstd")}
    for name, level in defaults.items():
        made = codec(name)
        assert made is not None
        assert made.compression_level == level


def test_a_channel_keeps_how_its_rows_were_labelled(tmp_path: Path) -> None:
    channel = Channel(str(tmp_path), "live")
    channel.create(NUMBERED, num_buckets=2, labels={"strategy": "immediate", "window": "5 min"})
    assert Channel(str(tmp_path), "live").meta().label_strategy == "immediate"
    with pytest.raises(HandoffError, match=r"labelled 'immediate', not 'window'.*new channel"):
        channel.create(NUMBERED, num_buckets=2, labels={"strategy": "window"})
    channel.create(NUMBERED, num_buckets=2)  # a reader's check of an existing channel
    older = Channel(str(tmp_path), "old")
    older.create(NUMBERED, num_buckets=2)
    assert older.meta().label_strategy == "window"  # channels that say nothing are final


def test_wrong_schema_and_missing_channels_fail_before_the_first_batch(tmp_path: Path) -> None:
    Writer(tmp_path, "c").commit([10])
    expected = pa.schema([("id", pa.int64()), ("y", pa.float32())])
    with pytest.raises(SchemaMismatchError, match=r"missing y; unexpected x"):
        ChannelReader(str(tmp_path), "c", expected_schema=expected)
    with pytest.raises(ChannelNotFoundError, match=r"no channel 'live'.*channels there: c"):
        ChannelReader(str(tmp_path), "live")
    with pytest.raises(ChannelNotFoundError, match="does not exist"):
        ChannelReader(str(tmp_path / "nowhere"), "c")


def test_a_replayed_commit_changes_nothing(tmp_path: Path) -> None:
    w = Writer(tmp_path, "c")
    w.commit([10, 10])
    commit = w.channel.commit(0)
    assert not w.channel.add_commit(commit)
    assert w.channel.commit_ids() == [0]


def test_retention_deletes_what_every_consumer_read_and_backpressure_waits(tmp_path: Path) -> None:
    channel = Channel(str(tmp_path), "live")
    channel.create(NUMBERED, num_buckets=1, max_unconsumed_bytes=1)
    w = Writer.__new__(Writer)
    w.channel, w.buckets, w.next_id, w.batch, w.writer = channel, 1, 0, 0, ""
    w.commit([100])
    w.commit([100])
    options = ReadOptions(batch_size=10, follow=True, consumer_group="trainer", record_every=0)
    reader = ChannelReader(str(tmp_path), "live", options=options)
    iterator = iter(reader)
    assert next(iterator) is not None
    assert channel.unconsumed_bytes() > 1  # nothing fully read yet
    unread_while_waiting: list[int] = []

    def consumer_catches_up(_: float) -> None:
        unread_while_waiting.append(channel.unconsumed_bytes())
        channel.close()
        for _batch in iterator:
            pass

    channel.wait_for_room(poll=0.05, sleep=consumer_catches_up)
    assert len(unread_while_waiting) == 1  # the writer waited once, while the consumer lagged
    assert unread_while_waiting[0] > 1
    assert channel.unconsumed_bytes() == 0
    assert all(channel.retired(b) for b in channel.commit_ids())
    assert not list((tmp_path / "live" / "shards").rglob("*.arrow"))


def test_backpressure_reports_the_time_waited_not_the_time_retention_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stage says "waited Ns for consumers (backpressure)" past a second: retention's own
    # work (a slow fold on a loaded machine, flow bench soak) is not waiting for anyone.
    channel = Channel(str(tmp_path), "live")
    channel.create(NUMBERED, num_buckets=1, max_unconsumed_bytes=10**9)

    def slow_retire() -> int:
        time.sleep(0.3)
        return 0

    monkeypatch.setattr(channel, "retire", slow_retire)
    assert channel.wait_for_room(sleep=lambda _: None) == 0.0


def test_a_closed_channel_reopens_when_its_producer_writes_again(tmp_path: Path) -> None:
    w = Writer(tmp_path, "c")
    w.channel.close()
    assert w.channel.closed()
    w.channel.reopen()
    assert not w.channel.closed()


def test_a_bucket_subset_is_a_stable_held_out_slice(tmp_path: Path) -> None:
    w = Writer(tmp_path, "c", buckets=4)
    every = w.commit([50, 60, 70, 80, 90, 100, 110, 120])

    def ids(buckets: frozenset[int] | None, rank: int = 0, size: int = 1) -> list[int]:
        options = ReadOptions(batch_size=16, buckets=buckets)
        reader = ChannelReader(str(tmp_path), "c", world=World(rank, size), options=options)
        return [i for batch in read_ids(reader) for i in batch]

    held, kept = ids(frozenset({1})), ids(frozenset({0, 2, 3}))
    assert sorted(held + kept) == sorted(every)
    assert not set(held) & set(kept)
    assert held == ids(frozenset({1})), "the same slice every time"
    ranks = [ids(frozenset({0, 2, 3}), r, 2) for r in range(2)]
    assert sorted(ranks[0] + ranks[1]) == sorted(kept)
    assert abs(len(ranks[0]) - len(ranks[1])) <= 1
    with pytest.raises(ConfigError, match=r"buckets \[7\] do not exist"):
        ChannelReader(str(tmp_path), "c", options=ReadOptions(buckets=frozenset({7})))
    with pytest.raises(ConfigError, match="cannot record consumption"):
        ReadOptions(buckets=frozenset({0}), consumer_group="trainer")


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    commits=st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=6), min_size=2, max_size=4)
)
def test_ranks_of_a_bucket_subset_read_its_every_row_once_over_many_commits(
    tmp_path_factory: pytest.TempPathFactory, commits: list[list[int]]
) -> None:
    """The ranks balance the rows of the chosen buckets, commit after commit, not the commits'
    rows: balanced on those, the batch sizes of a finite epoch left rows unread."""
    root = tmp_path_factory.mktemp("subset")
    w = Writer(root, "c", buckets=4)
    for sizes in commits:
        w.commit(sizes)
    options = ReadOptions(batch_size=4, window_rows=20, buckets=frozenset({0, 2, 3}))
    whole = [i for b in read_ids(ChannelReader(str(root), "c", options=options)) for i in b]
    ranks = [
        [i for b in read_ids(ChannelReader(str(root), "c", world=World(r, 2), options=options))
         for i in b]
        for r in range(2)
    ]  # fmt: skip
    if len(whole) >= 2:
        assert sorted(ranks[0] + ranks[1]) == sorted(whole)


def test_after_commit_reads_only_what_arrived_since(tmp_path: Path) -> None:
    w = Writer(tmp_path, "c")
    w.commit([30, 30])
    later = w.commit([20, 25]) + w.commit([10])
    options = ReadOptions(batch_size=8, after_commit=0)
    for follow in (False, True):
        reader = ChannelReader(str(tmp_path), "c", options=replace(options, follow=follow))
        if follow:
            w.channel.close()
        assert sorted(i for batch in read_ids(reader) for i in batch) == sorted(later)


@pytest.mark.parametrize("world_size", [3, 5, 6, 7])
def test_any_world_size_reads_every_row_once_in_as_many_batches(
    tmp_path: Path, world_size: int
) -> None:
    w = Writer(tmp_path, "c", buckets=64)
    written = w.commit([37] * 64) + w.commit([11] * 20)
    options = ReadOptions(batch_size=16, window_rows=64, seed=1)
    per_rank = [
        read_ids(ChannelReader(str(tmp_path), "c", world=World(r, world_size), options=options))
        for r in range(world_size)
    ]
    assert len({len(batches) for batches in per_rank}) == 1  # DDP needs as many on every rank
    assert sorted(i for batches in per_rank for b in batches for i in b) == sorted(written)
