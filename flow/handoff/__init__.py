"""The handoff from Spark to PyTorch: Arrow IPC shards, commit records, a shuffling reader.

Writers (Spark tasks) add shards and a driver commits them; readers (trainer ranks) read the
committed ones: their buckets, balanced, shuffled in bounded windows, resumable, following new
commits. Storage is anything ``pyarrow.fs`` opens (local disk, S3, HDFS, GCS).

    from flow.handoff import ChannelReader, ReadOptions, World
    for batch in ChannelReader("s3://bucket/handoff/ctr", "live", world=World(rank, size)):
        ...

Without Spark, ``write_table(location, channel, table_or_dataframe, batch_id=...)`` writes the
same shards and commits from pandas or pyarrow.
"""

from flow.handoff.channel import Channel, ConsumerPosition, list_channels

# Bound here, not lazily: the function shadows its submodule's name, and only a binding made
# while the package loads keeps `flow.handoff.convert(df)` the function after a later
# `from flow.handoff.convert import ...`. It loads no engine until called.
from flow.handoff.convert import Conversion, convert
from flow.handoff.format import ChannelMeta, Commit, ShardInfo, WriterHead
from flow.handoff.mix import MixedReader
from flow.handoff.pickup import Origin, PickUp
from flow.handoff.plan import World
from flow.handoff.reader import ChannelReader, ReadOptions, ReadStats, every_rank
from flow.handoff.sequence import MissingCommit
from flow.handoff.slices import WindowRows, WindowSlice
from flow.handoff.verify import Problem, VerifyReport
from flow.handoff.write import WriteResult, write_table

__all__ = [
    "Channel",
    "ChannelMeta",
    "ChannelReader",
    "Commit",
    "ConsumerPosition",
    "Conversion",
    "MissingCommit",
    "MixedReader",
    "Origin",
    "PickUp",
    "Problem",
    "ReadOptions",
    "ReadStats",
    "ShardInfo",
    "VerifyReport",
    "WindowRows",
    "WindowSlice",
    "World",
    "WriteResult",
    "WriterHead",
    "convert",
    "every_rank",
    "list_channels",
    "write_table",
]
