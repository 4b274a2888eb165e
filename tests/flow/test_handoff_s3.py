"""The handoff on S3-compatible object storage (pyarrow.fs), not only local disk."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from flow.errors import ConfigError, ShardCorruptError
from flow.handoff import Channel, ChannelReader, Commit, ReadOptions, World, list_channels
from flow.storage import counting_location, location
from tests.support import NUMBERED, Writer, read_ids


def test_channels_are_written_listed_read_and_verified_on_s3(s3_uri: str) -> None:
    root = location(s3_uri).child("reads")
    writer = Writer(root.uri, "train", buckets=4)
    written = writer.commit([300, 200, 150, 90]) + writer.commit([64, 64])
    assert list_channels(root.uri) == ["train"]
    options = ReadOptions(batch_size=50, seed=2)
    per_rank = [
        read_ids(ChannelReader(root.uri, "train", world=World(r, 2), options=options))
        for r in range(2)
    ]
    assert len({len(b) for b in per_rank}) == 1
    assert Counter(i for rank in per_rank for b in rank for i in b) == Counter(written)

    shard = writer.channel.commit(0).shards[0]
    objects = writer.channel.folder
    with objects.fs.open_output_stream(f"{objects.path}/{shard.path}") as out:
        out.write(b"not an arrow file")
    with pytest.raises(ShardCorruptError, match=r"s3://.*\.arrow.*truncated"):
        read_ids(ChannelReader(root.uri, "train", options=options))


def test_a_location_in_a_missing_bucket_fails_its_write_check(s3_uri: str) -> None:
    location(s3_uri).child("checked").check_writable("FLOW_HANDOFF")  # a PUT and a DELETE
    missing = s3_uri.replace("@handoff/", "@no-such-bucket/")
    with pytest.raises(ConfigError, match=r"^FLOW_HANDOFF: cannot write to s3://no-such-bucket/"):
        location(missing).check_writable("FLOW_HANDOFF")  # and the credentials are not shown


def test_a_commit_on_s3_makes_no_folders_first(s3_uri: str) -> None:
    # Folders are key prefixes on an object store: pyarrow's create_dir would cost a HEAD or a
    # marker PUT per level on each of a commit's writes (flow/handoff/README.md).
    root = location(s3_uri).child("requests")
    writer = Writer(root.uri, "c", buckets=1)
    writer.commit([10])
    counted, calls = counting_location(root)
    channel = Channel(counted, "c")
    rows = pa.table({"id": np.arange(10), "x": [[0.0, 1.0, 2.0]] * 10}, schema=NUMBERED)
    shard = channel.write_bucket(1, 0, rows, "t")
    calls.calls.clear()
    channel.add_commit(Commit("c", 1, (shard,), channel.meta().fingerprint, writer="w"))
    assert "mkdir" not in calls.calls, calls.calls
    assert calls.total() <= 10, calls.calls
