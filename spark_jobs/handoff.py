"""Spark DataFrames into a handoff channel: bucketed and shuffled by Spark, written by its tasks.

Rows get a bucket, ``hash(shuffle key or the row's place, seed) mod num_buckets``; a repartition
by bucket (Spark's all-to-all shuffle) sends each bucket to one task. Each task (``mapInArrow``,
pyarrow and numpy only) groups its rows by bucket, writes each bucket's rows permuted as shards of
at most ``max_rows_per_shard`` rows, and returns what it wrote; the driver then commits exactly
those shards. Shards of failed or speculative task attempts are never returned, so never committed,
so never read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from flow.errors import HandoffError
from flow.handoff import Channel, ChannelMeta, Commit, ShardInfo
from flow.handoff.format import schema_fingerprint
from flow.handoff.shards import fixed_size_lists
from flow.handoff.write import check_writer
from spark_jobs.arrow_batches import sized_batches
from spark_jobs.constants import batch_value
from spark_jobs.jvm import default_parallelism, executed_plan

__all__ = [
    "BUCKET",
    "SHARDS",
    "SHARDS_ARROW",
    "ExportOptions",
    "arrow_schema",
    "check_writer",
    "commit_shards",
    "export",
    "open_channel",
    "prepare_export",
    "task_writer",
]

BUCKET = "_flow_bucket"
"""A row's bucket, beside its columns, as the writer tasks receive it."""
_TASK = "_flow_task"
SHARDS = (
    "path string, bucket int, rows long, bytes long, checksum string, "
    "event_min timestamp, event_max timestamp, label_sum double"
)
SHARDS_ARROW = pa.schema(
    [
        ("path", pa.string()),
        ("bucket", pa.int32()),
        ("rows", pa.int64()),
        ("bytes", pa.int64()),
        ("checksum", pa.string()),
        ("event_min", pa.timestamp("us", tz="UTC")),
        ("event_max", pa.timestamp("us", tz="UTC")),
        ("label_sum", pa.float64()),
    ]
)


@dataclass(frozen=True)
class ExportOptions:
    """How a DataFrame becomes shards."""

    num_buckets: int = 64
    compression: str | None = "lz4"
    compression_level: int | None = None
    """None: the handoff's default for the codec (see flow.handoff.shards.codec)."""
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
    labels: Mapping[str, str] | None = None
    """How the rows were labelled (ChannelMeta.labels)."""
    units: Mapping[str, Mapping[str, Any]] | None = None
    """How the dense values map back to raw units (ChannelMeta.units)."""
    tasks: int | None = None
    """Writer tasks (default: min(buckets, 2 x Spark's parallelism))."""
    label_sum: str | None = None
    """A label column the writer tasks sum as they write: the commit's ``positives`` stat,
    without a Spark job of its own (binary labels: the positive rows)."""
    features: Mapping[str, Any] | None = None
    """What made the rows, for a model serving on raw events (flow.transform.ServingFeatures as
    plain data): recorded when the channel is created."""


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


def _fixed_sizes(df: DataFrame, channel: Channel) -> dict[str, int]:
    """The channel's fixed-size lists once it exists (a micro-batch without rows has no array
    lengths to look at, and must still be written as a commit); else what ``df`` holds."""
    if channel.exists():
        schema = channel.meta().schema
        return {f.name: f.type.list_size for f in schema if pa.types.is_fixed_size_list(f.type)}
    return _array_lengths(df)


def arrow_schema(df: DataFrame, fixed_sizes: Mapping[str, int]) -> pa.Schema:
    """The channel schema of ``df``: Arrow types, fixed-length arrays as fixed-size lists."""
    fields = []
    for f in to_arrow_schema(df.schema, timestamp_utc=True):
        if f.name in fixed_sizes and pa.types.is_list(f.type):
            fields.append(pa.field(f.name, pa.list_(f.type.value_type, fixed_sizes[f.name]), False))
        else:
            fields.append(f)
    return pa.schema(fields)


class _Buckets:
    """One writer task's rows, grouped by bucket until a bucket fills a shard.

    Rows arrive in Arrow batches of mixed buckets; each batch is regrouped by bucket (one
    gather). A shard is written when its bucket reaches ``max_rows``, or, when the task holds
    more than ``2 x max_rows`` rows in all, for its largest bucket, so memory stays bounded
    however many buckets a task has. Each shard's rows are permuted once more as a whole
    (seeded), so rows from the same upstream partition do not stay together.
    """

    def __init__(
        self,
        write: Callable[[int, pa.Table], None],
        max_rows: int,
        rng: np.random.Generator,
    ) -> None:
        self._write = write
        self._max_rows = max_rows
        self._rng = rng
        self._pieces: dict[int, list[pa.RecordBatch]] = {}
        self._rows: dict[int, int] = {}
        self._held = 0

    def add(self, batch: pa.RecordBatch) -> None:
        buckets = batch.column(BUCKET).to_numpy()
        order = np.argsort(buckets, kind="stable")
        grouped = batch.drop_columns([BUCKET]).take(pa.array(order))
        ordered = buckets[order]
        starts = np.flatnonzero(np.diff(ordered)) + 1
        for start, stop in zip(
            [0, *starts.tolist()], [*starts.tolist(), len(ordered)], strict=True
        ):
            if stop > start:
                bucket = int(ordered[start])
                self._pieces.setdefault(bucket, []).append(grouped.slice(start, stop - start))
                self._rows[bucket] = self._rows.get(bucket, 0) + stop - start
        self._held += len(ordered)
        for bucket in [b for b, n in self._rows.items() if n >= self._max_rows]:
            self._flush(bucket)
        while self._held > 2 * self._max_rows:
            self._flush(max(self._rows, key=lambda b: self._rows[b]))

    def finish(self) -> None:
        for bucket in sorted(self._rows):
            self._flush(bucket)

    def _flush(self, bucket: int) -> None:
        table = pa.Table.from_batches(self._pieces.pop(bucket))
        self._held -= self._rows.pop(bucket)
        for start in range(0, table.num_rows, self._max_rows):
            part = table.slice(start, self._max_rows)
            order = pa.array(self._rng.permutation(part.num_rows))
            self._write(bucket, part.take(order).combine_chunks())


def task_writer(
    root: str, channel: str, batch_id: int, options: ExportOptions
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function each writer task runs: its rows, of several buckets (:data:`BUCKET`), in
    Arrow batches; it yields what it wrote (:data:`SHARDS_ARROW`)."""
    event_time, label = options.event_time, options.label_sum

    def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition, attempt = (
            (context.partitionId(), context.attemptNumber()) if context is not None else (0, 0)
        )
        task = f"p{partition}-a{attempt}" if context is not None else "local"
        target = Channel(root, channel)
        written: list[dict[str, Any]] = []

        def shard(bucket: int, table: pa.Table) -> None:
            info = target.write_bucket(batch_id, bucket, table, task)
            low = high = None
            if event_time is not None and table.num_rows:
                extremes = pc.min_max(table.column(event_time))
                low, high = extremes["min"].as_py(), extremes["max"].as_py()
            total = pc.sum(table.column(label)).as_py() if label and table.num_rows else None
            written.append(
                {**info.__dict__, "event_min": low, "event_max": high, "label_sum": total}
            )

        # Fixed-length arrays as fixed-size lists first: regrouping those is a block copy.
        sizes = {
            f.name: f.type.list_size
            for f in target.meta().schema
            if pa.types.is_fixed_size_list(f.type)
        }
        rng = np.random.default_rng([options.seed, batch_id, partition])
        buckets = _Buckets(shard, options.max_rows_per_shard, rng)
        for batch in batches:
            table = fixed_size_lists(pa.Table.from_batches([batch]), sizes)
            for part in table.to_batches():
                buckets.add(part)
        buckets.finish()
        if written:
            yield pa.RecordBatch.from_pylist(written, schema=SHARDS_ARROW)

    return write


_KEYS: dict[tuple[str, int], list[int]] = {}


def _partition_keys(spark: SparkSession, tasks: int) -> list[int]:
    """For each task t, an int that Spark's hash partitioning into ``tasks`` sends to task t.

    Repartitioning by the bucket itself would hash the bucket ids: some tasks would get two
    or three buckets and others none (a straggler, or idle cores). Repartitioning by these
    keys sends bucket b to task ``b % tasks`` exactly. Found by asking Spark for the partition
    of candidate ints (``pmod(hash(k), tasks)`` is what ``repartition(tasks, k)`` computes),
    once per Spark version and task count: a job each micro-batch cost 0.1 s.
    """
    cached = _KEYS.get((spark.version, tasks))
    if cached is not None:
        return cached
    found: dict[int, int] = {}
    candidates = 64 * tasks
    while len(found) < tasks:
        k = F.col("id").cast("int")
        rows = (
            spark.range(candidates)
            .select(k.alias("k"), F.pmod(F.hash(k), F.lit(tasks)).alias("p"))
            .collect()
        )
        for row in rows:
            found.setdefault(int(row["p"]), int(row["k"]))
        candidates *= 4
    keys = _KEYS[(spark.version, tasks)] = [found[t] for t in range(tasks)]
    return keys


def _stats(
    given: Mapping[str, float] | None, shards: Sequence[Any], label: str | None
) -> dict[str, float]:
    """The commit's stats: ``given``, and with ``label``, the positives the tasks counted."""
    stats = dict(given or {})
    if label is not None:
        stats["positives"] = round(sum(r["label_sum"] or 0.0 for r in shards))
    return stats


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
    """Write ``df`` as batch ``batch_id`` of ``channel``: the commit, numbered in ``writer``'s
    sequence (a ``df`` without rows is a commit too); None if that batch is already committed.

    ``writer`` names the producer; a channel another writer committed to is refused, since its
    batch ids would be mistaken for replays.
    """
    return prepare_export(
        df,
        channel,
        batch_id,
        options=options,
        writer=writer,
        source_positions=source_positions,
        stats=stats,
        progress=progress,
    )()


def open_channel(channel: Channel, schema: pa.Schema, options: ExportOptions) -> ChannelMeta:
    """The channel made (or found, the same) for rows of ``schema``, open for writing."""
    meta = channel.create(
        schema,
        num_buckets=options.num_buckets,
        compression=options.compression,
        compression_level=options.compression_level,
        layout=options.layout,
        feature_state=options.feature_state,
        max_unconsumed_bytes=options.max_unconsumed_bytes,
        labels=options.labels,
        units=options.units,
        features=options.features,
    )
    channel.reopen()
    return meta


def prepare_export(
    df: DataFrame,
    channel: Channel,
    batch_id: int,
    *,
    options: ExportOptions,
    writer: str,
    source_positions: Mapping[str, Any] | None = None,
    stats: Mapping[str, float] | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> Callable[[], Commit | None]:
    """:func:`export` in two steps: this call checks the channel (creating it, waiting for
    room) and plans the write, without a Spark job; calling what it returns runs the write and
    commits. A micro-batch's writer plans while another job of the batch runs."""
    check_writer(channel, writer)
    if channel.exists() and channel.committed(batch_id):
        return lambda: None
    sizes = (
        dict(options.fixed_sizes) if options.fixed_sizes is not None else _fixed_sizes(df, channel)
    )
    schema = arrow_schema(df, sizes)
    meta = open_channel(channel, schema, options)
    waited = channel.wait_for_room(progress)
    if waited > 1:
        progress(f"channel {channel.name}: waited {waited:.0f}s for consumers (backpressure)")
    spark = df.sparkSession
    # Without a shuffle key, a row's place in its partition (the same input, the same place)
    # hashed with the seed: what rand(seed) gave, without the seed in the generated code (a
    # micro-batch's seed is its id: spark_jobs.constants).
    key = (
        F.col(options.shuffle_key).cast("string")
        if options.shuffle_key
        else F.monotonically_increasing_id()
    )
    tasks = options.tasks or min(options.num_buckets, 2 * default_parallelism(spark))
    # The all-to-all shuffle is Spark's; grouping by bucket and permuting within a shard are
    # the task's (in Python: a Spark sort within partitions cost as much as the exchange).
    seed = batch_value(options.seed, "int")
    bucket = F.pmod(F.xxhash64(key, seed), F.lit(options.num_buckets)).cast("int")
    keys = F.array(*[F.lit(k) for k in _partition_keys(spark, tasks)])
    shuffled = (
        df.withColumn(BUCKET, bucket)
        .withColumn(_TASK, F.element_at(keys, F.col(BUCKET) % tasks + 1))
        .repartition(tasks, _TASK)
        .drop(_TASK)
    )
    writer_task = task_writer(channel.root.uri, channel.name, batch_id, options)
    written = shuffled.mapInArrow(writer_task, SHARDS)
    row_schema = shuffled.schema
    # Planned now (Spark's optimizer and physical planning, ~0.2-0.4 s of driver time for a
    # featurized micro-batch), not when write() runs: a micro-batch plans while its counts job
    # runs. The Arrow batch sizes are read when planning, so inside sized_batches as well.
    # prepare() starts the plan's broadcasts (the vocabularies' tables) in the background.
    with sized_batches(spark, row_schema, sizes):
        executed_plan(written).prepare()

    def write() -> Commit | None:
        with sized_batches(spark, row_schema, sizes):
            rows = written.collect()
        return commit_shards(
            rows, channel, batch_id, schema, meta, writer, options, source_positions, stats
        )

    return write


def commit_shards(
    rows: Sequence[Any],
    channel: Channel,
    batch_id: int,
    schema: pa.Schema,
    meta: ChannelMeta,
    writer: str,
    options: ExportOptions,
    source_positions: Mapping[str, Any] | None,
    stats: Mapping[str, float] | None,
) -> Commit | None:
    """The commit of the shards the writer tasks reported (``rows``)."""
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
        stats=_stats(stats, rows, options.label_sum),
        committed_at=datetime.now(UTC).isoformat(),
    )
    if schema_fingerprint(schema) != meta.fingerprint:
        raise HandoffError(f"channel {channel.name!r} changed schema while writing")
    # Numbered in the writer's sequence, even without rows: a micro-batch that made no training
    # rows is still a commit, so a reader can tell that nothing is missing after it.
    return channel.add_commit(commit)
