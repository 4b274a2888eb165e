"""Spark writing the handoff, on the real session: bucketed, shuffled, committed once."""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from flow.config import StackConfig
from flow.errors import HandoffError, SchemaMismatchError
from flow.handoff import Channel, ChannelReader, Commit, ReadOptions, World
from flow.stack.kafka import ensure_topics, producer
from spark_jobs.handoff import ExportOptions, export
from spark_jobs.sources import read_kafka

pytestmark = pytest.mark.integration


def rows(spark: SparkSession, start: int, count: int):
    return spark.range(start, start + count).select(
        F.col("id"),
        F.array(
            F.col("id").cast("float"), F.lit(1.0).cast("float"), F.lit(2.0).cast("float")
        ).alias("dense"),
        (F.col("id") % 7 == 0).cast("float").alias("label"),
        F.timestamp_seconds(F.lit(1767225600) + F.col("id")).alias("ts"),
    )


def ids_per_rank(root: Path, channel: str, world_size: int, **options: object) -> list[list[int]]:
    out = []
    for rank in range(world_size):
        reader = ChannelReader(
            str(root),
            channel,
            world=World(rank, world_size),
            options=ReadOptions(batch_size=100, **options),  # type: ignore[arg-type]
        )
        out.append([i for batch in reader for i in batch.column("id").to_pylist()])
    return out


def test_a_dataframe_is_bucketed_shuffled_and_read_back_once_per_row(
    spark: SparkSession, tmp_path: Path
) -> None:
    channel = Channel(str(tmp_path), "train")
    options = ExportOptions(num_buckets=8, event_time="ts", tasks=4, label_sum="label")
    commit = export(rows(spark, 0, 10_000), channel, 0, options=options, writer="test")
    assert commit is not None
    assert commit.rows == 10_000
    # The writer tasks counted the positive labels (every 7th id) as they wrote.
    assert commit.stats["positives"] == len(range(0, 10_000, 7))
    assert {s.bucket for s in commit.shards} == set(range(8))
    # Bucket b goes to task b % 4, exactly: two buckets per task, none idle.
    tasks = {s.bucket: s.path.split("-")[1] for s in commit.shards}
    assert tasks == {b: f"p{b % 4}" for b in range(8)}
    assert commit.event_time["min"] is not None
    meta = channel.meta()
    dense = meta.schema.field("dense").type
    assert pa.types.is_fixed_size_list(dense)
    assert dense.list_size == 3

    per_rank = ids_per_rank(tmp_path, "train", 4)
    assert Counter(i for r in per_rank for i in r) == Counter(range(10_000))
    # Rows within a shard were permuted by the writer task: not in id order.
    first = ChannelReader(
        str(tmp_path), "train", options=ReadOptions(batch_size=100, shuffle=False)
    )
    batch = next(iter(first))
    assert batch.column("id").to_pylist() != sorted(batch.column("id").to_pylist())


def test_replays_orphans_second_writers_and_schema_changes(
    spark: SparkSession, tmp_path: Path
) -> None:
    channel = Channel(str(tmp_path), "train")
    options = ExportOptions(num_buckets=4, tasks=2)
    assert export(rows(spark, 0, 1000), channel, 0, options=options, writer="w") is not None
    assert export(rows(spark, 0, 1000), channel, 0, options=options, writer="w") is None  # replay
    # A failed task attempt's shard on disk is never named by a commit, so never read.
    orphan = tmp_path / "train" / "shards" / f"{0:020d}" / "00000-p0-a0-deadbeef.arrow"
    orphan.write_bytes(next((tmp_path / "train" / "shards").rglob("*.arrow")).read_bytes())
    assert sorted(i for r in ids_per_rank(tmp_path, "train", 1) for i in r) == list(range(1000))

    # ... and `flow handoff verify` names it (one that lands after its batch's commit).
    assert [(p.kind, p.path) for p in channel.verify().problems] == [
        ("orphan", f"shards/{0:020d}/{orphan.name}")
    ]

    with pytest.raises(HandoffError, match="was written by w, not other"):
        export(rows(spark, 1000, 10), channel, 1, options=options, writer="other")
    with pytest.raises(SchemaMismatchError, match="missing dense"):
        export(rows(spark, 1000, 10).drop("dense"), channel, 1, options=options, writer="w")


def test_every_batch_is_a_numbered_commit_even_one_without_rows(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A micro-batch that made no training rows still commits: the next one's ``previous``
    names it, so a reader can tell nothing was lost in between."""
    channel = Channel(str(tmp_path), "live")
    options = ExportOptions(num_buckets=4, tasks=2)  # fixed sizes found from the first rows

    def write(frame: DataFrame, batch_id: int) -> Commit | None:
        return export(frame, channel, batch_id, options=options, writer="stream:1")

    commits = [
        write(rows(spark, 0, 300), 0),
        write(rows(spark, 0, 300).where("false"), 1),  # no rows, no array lengths to look at
        write(rows(spark, 300, 200), 2),
    ]
    assert [(c.seq, c.previous, c.rows) for c in commits if c is not None] == [
        (0, None, 300),
        (1, 0, 0),
        (2, 1, 200),
    ]
    assert write(rows(spark, 0, 300).where("false"), 1) is None  # a replay writes nothing
    report = channel.verify()
    assert report.ok, report.problems
    assert sorted(i for r in ids_per_rank(tmp_path, "live", 2) for i in r) == list(range(500))


def test_a_streaming_query_writes_while_a_reader_follows(
    spark: SparkSession, running_stack: StackConfig, tmp_path: Path
) -> None:
    topic = f"handoff-{uuid.uuid4().hex[:8]}"
    ensure_topics(running_stack.kafka, [topic], partitions=2)
    out = producer(running_stack.kafka)
    for i in range(3000):
        out.produce(topic, json.dumps({"id": i}).encode())
    assert out.flush(30) == 0

    channel = Channel(str(tmp_path), "live")
    got: list[int] = []
    follower_started = threading.Event()

    def follow() -> None:
        while not channel.exists():
            threading.Event().wait(0.05)
        follower_started.set()
        reader = ChannelReader(
            str(tmp_path), "live", options=ReadOptions(batch_size=64, follow=True)
        )
        got.extend(i for batch in reader for i in batch.column("id").to_pylist())

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    options = ExportOptions(num_buckets=4, tasks=2)

    def sink(batch, batch_id: int) -> None:
        frame = batch.select(
            F.get_json_object(F.col("value").cast("string"), "$.id").cast("long").alias("id")
        )
        export(frame, channel, batch_id, options=options, writer="stream")

    raw = read_kafka(spark, running_stack.kafka, [topic], options={"maxOffsetsPerTrigger": "700"})
    query = (
        raw.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert len(channel.commit_ids()) >= 4  # 3000 records in batches of at most 700
    channel.close()
    thread.join(timeout=60)
    assert follower_started.is_set()
    assert sorted(got) == list(range(3000))


def test_a_dataframe_converts_to_a_torch_dataloader(spark: SparkSession, tmp_path: Path) -> None:
    import flow.handoff  # the spelling docs/handoff.md uses

    frame = rows(spark, 0, 5000)
    where = str(tmp_path / "converted")
    with flow.handoff.convert(frame, location=where, num_buckets=4, compression_level=-8) as data:
        assert data.rows == 5000
        assert Channel(where, "data").meta().compression_level == -8
        loader = data.dataloader(batch_size=256, columns=["id", "dense", "label"])
        ids = [int(i) for batch in loader for i in batch["id"]]
        assert sorted(ids) == list(range(5000))
        assert next(iter(loader))["dense"].shape == (256, 3)
    assert (tmp_path / "converted").exists()  # a location given is not the conversion's to delete

    with flow.handoff.convert(frame, num_buckets=4) as owned:
        made = owned.location
        assert Channel(made, "data").exists()
    assert not Path(made).exists()


def test_spark_tasks_write_shards_to_object_storage(spark: SparkSession, s3_uri: str) -> None:
    from flow.storage import location

    root = location(s3_uri).child("spark")
    channel = Channel(root.uri, "train")
    commit = export(
        rows(spark, 0, 4000), channel, 0, options=ExportOptions(num_buckets=4, tasks=2), writer="s3"
    )
    assert commit is not None
    assert commit.rows == 4000
    reader = ChannelReader(root.uri, "train", options=ReadOptions(batch_size=500))
    assert sorted(i for b in reader for i in b.column("id").to_pylist()) == list(range(4000))
