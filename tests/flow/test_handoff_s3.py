"""The handoff on S3-compatible object storage (pyarrow.fs), not only local disk."""

from __future__ import annotations

from collections import Counter

import pytest

from flow.errors import ConfigError, ShardCorruptError
from flow.handoff import ChannelReader, ReadOptions, World, list_channels
from flow.storage import location
from tests.support import Writer, read_ids


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
