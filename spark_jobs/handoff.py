"""Spark DataFrames into a handoff channel: bucketed and shuffled by Spark, written by its tasks.

Rows get a bucket, ``hash(shuffle key or a random value, seed) mod num_buckets``, and a random
sort key; a repartition by bucket (Spark's all-to-all shuffle) and a sort within partitions put
each bucket's rows together in random order. Each task (``mapInArrow``, pyarrow only) writes one
shard per bucket it holds, and returns what it wrote; the driver then commits exactly those
shards. Shards of failed or speculative task attempts are never returned, so never committed,
so never read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from flow.errors import HandoffError
from flow.handoff import Channel, Commit, ShardInfo
from flow.handoff.format import schema_fingerprint

__all__ = ["ExportOptions", "arrow_schema", "export"]

_BUCKET = "_flow_bucket"
_ORDER = "_flow_order"
_SHARDS = (
    "path string, bucket int, rows long, bytes long, checksum string, "
    "event_min timestamp, event_max timestamp"
)
_SHARDS_ARROW = pa.schema(
    [
        ("path", pa.string()),
        ("bucket", pa.int32()),
        ("rows", pa.int64()),
        ("bytes", pa.int64()),
        ("checksum", pa.string()),
        ("event_min", pa.timestamp("us", tz="UTC")),
        ("event_max", pa.timestamp("us", tz="UTC")),
    ]
)


@dataclass(frozen=True)
class ExportOptions:
    """How a DataFrame becomes shards."""

    num_buckets: int = 64
    compression: str | None = "lz4"
    shuffle_key: str | None = None
    seed: int = 0
    max_rows_per_shard: int = 256_000
    event_time: str | None = None
    """A timestamp column whose range each commit records."""
    fixed_sizes: Mapping[str, int] | None = None
    """Array columns of one length per row, stored as fixed-size lists (feature blocks). None:
    every array column whose lengths are all equal."""
    layout: Mapping[str, Any] | None = None
    feature_state: str | None = None
    max_unconsumed_bytes: int | None = None
    tasks: int | None = None
    """Writer tasks (default: min(buckets, 2 x Spark's parallelism))."""


def _array_lengths(df: DataFrame) -> dict[str, int]:
    """Array columns whose rows all have the same length, with that length (one Spark job)."""
    arrays = [f.name for f in df.schema.fields if f.dataType.typeName() == "array"]
    if not arrays:
        return {}
    aggregates = []
    for name in arrays:
        length = F.size(F.col(name))
        aggregates += [F.min(length).alias(f"lo_{name}"), F.max(length).alias(f"hi_{name}")]
    row = df.agg(*aggregates).first()
    if row is None:
        return {}
    return {
        n: int(row[f"lo_{n}"])
        for n in arrays
        if row[f"lo_{n}"] is not None and row[f"lo_{n}"] == row[f"hi_{n}"] and row[f"lo_{n}"] > 0
    }


def arrow_schema(df: DataFrame, fixed_sizes: Mapping[str, int]) -> pa.Schema:
    """The channel schema of ``df``: Arrow types, fixed-length arrays as fixed-size lists."""
    fields = []
    for f in to_arrow_schema(df.schema, timestamp_utc=True):
        if f.name in fixed_sizes and pa.types.is_list(f.type):
            fields.append(pa.field(f.name, pa.list_(f.type.value_type, fixed_sizes[f.name]), False))
        else:
            fields.append(f)
    return pa.schema(fields)


def _task_writer(
    root: str, channel: str, batch_id: int, event_time: str | None, max_rows: int
) -> Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]]:
    """The function each writer task runs: its rows arrive grouped by bucket, in random order."""

    def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        task = (
            f"p{context.partitionId()}-a{context.attemptNumber()}"
            if context is not None
            else "local"
        )
        target = Channel(root, channel)
        written: list[dict[str, Any]] = []
        run: list[pa.RecordBatch] = []
        run_rows = 0
        run_bucket = -1

        def flush() -> None:
            nonlocal run, run_rows
            if not run_rows:
                return
            table = pa.Table.from_batches(run).drop_columns([_BUCKET, _ORDER])
            info = target.write_bucket(batch_id, run_bucket, table, task)
            low = high = None
            if event_time is not None and table.num_rows:
                extremes = pc.min_max(table.column(event_time))
                low, high = extremes["min"].as_py(), extremes["max"].as_py()
            written.append({**info.__dict__, "event_min": low, "event_max": high})
            run, run_rows = [], 0

        for batch in batches:
            buckets = batch.column(_BUCKET).to_numpy()
            start = 0
            while start < len(buckets):
                bucket = int(buckets[start])
                end = start
                while end < len(buckets) and buckets[end] == bucket:
                    end += 1
                if bucket != run_bucket:
                    flush()
                    run_bucket = bucket
                piece = batch.slice(start, end - start)
                while piece.num_rows:
                    room = max_rows - run_rows
                    run.append(piece.slice(0, room))
                    run_rows += min(room, piece.num_rows)
                    piece = piece.slice(room)
                    if run_rows >= max_rows:
                        flush()
                start = end
        flush()
        if written:
            yield pa.RecordBatch.from_pylist(written, schema=_SHARDS_ARROW)

    return write


def export(
    df: DataFrame,
    channel: Channel,
    batch_id: int,
    *,
    options: ExportOptions,
    writer: str,
    source_positions: Mapping[str, Any] | None = None,
    stats: Mapping[str, float] | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> Commit | None:
    """Write ``df`` as batch ``batch_id`` of ``channel``; None if that batch is already committed.

    ``writer`` names the producer; a channel another writer committed to is refused, since its
    batch ids would be mistaken for replays.
    """
    if channel.exists():
        ids = channel.commit_ids()
        if ids:
            owner = channel.commit(ids[-1]).writer
            if owner and owner != writer:
                raise HandoffError(
                    f"channel {channel.name!r} in {channel.root} was written by {owner}, not "
                    f"{writer} (a reset checkpoint starts its batch ids again); write to a new "
                    "channel or remove this one"
                )
        if channel.committed(batch_id):
            return None
    sizes = dict(options.fixed_sizes) if options.fixed_sizes is not None else _array_lengths(df)
    schema = arrow_schema(df, sizes)
    meta = channel.create(
        schema,
        num_buckets=options.num_buckets,
        compression=options.compression,
        layout=options.layout,
        feature_state=options.feature_state,
        max_unconsumed_bytes=options.max_unconsumed_bytes,
    )
    channel.reopen()
    waited = channel.wait_for_room(progress)
    if waited > 1:
        progress(f"channel {channel.name}: waited {waited:.0f}s for consumers (backpressure)")
    spark = df.sparkSession
    key = F.col(options.shuffle_key).cast("string") if options.shuffle_key else F.rand(options.seed)
    tasks = options.tasks or min(options.num_buckets, 2 * spark.sparkContext.defaultParallelism)
    shuffled = (
        df.withColumn(
            _BUCKET,
            F.pmod(F.xxhash64(key, F.lit(options.seed)), F.lit(options.num_buckets)).cast("int"),
        )
        .withColumn(_ORDER, F.rand(options.seed + 1))
        .repartition(tasks, _BUCKET)
        .sortWithinPartitions(_BUCKET, _ORDER)
    )
    writer_task = _task_writer(
        channel.root.uri, channel.name, batch_id, options.event_time, options.max_rows_per_shard
    )
    rows = shuffled.mapInArrow(writer_task, _SHARDS).collect()
    shards = tuple(
        ShardInfo(r["path"], r["bucket"], r["rows"], r["bytes"], r["checksum"])
        for r in sorted(rows, key=lambda r: (r["bucket"], r["path"]))
    )
    lows = [r["event_min"] for r in rows if r["event_min"] is not None]
    highs = [r["event_max"] for r in rows if r["event_max"] is not None]
    commit = Commit(
        channel=channel.name,
        batch_id=batch_id,
        shards=shards,
        schema_fingerprint=meta.fingerprint,
        source_positions=dict(source_positions or {}),
        event_time={
            "min": min(lows).isoformat() if lows else None,
            "max": max(highs).isoformat() if highs else None,
        },
        writer=writer,
        stats=dict(stats or {}),
        committed_at=datetime.now(UTC).isoformat(),
    )
    if schema_fingerprint(schema) != meta.fingerprint:
        raise HandoffError(f"channel {channel.name!r} changed schema while writing")
    channel.add_commit(commit)
    return commit
