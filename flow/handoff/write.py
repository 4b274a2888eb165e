"""Writing a channel from pandas or pyarrow, without Spark: the same shards and commits.

    from flow.handoff import write_table
    done = write_table("/data/handoff/ctr", "backfill", frame, batch_id=0, label="label")

What Spark's writer (``spark_jobs/handoff.py``) does across a cluster, done in this process:
rows get buckets (a key's hash, or round-robin over a seeded permutation), each bucket's rows are
permuted and written as shards of at most ``max_rows_per_shard`` rows, and one commit names them
all, numbered in the writer's sequence. The channel records the schema (its fingerprint is in
every commit), the bucket count, the codec and the layout; a later write must match them.

Rows that cannot train are dead letters, as in the pipelines: a null label, a feature block of
the wrong length or with nulls, a sparse index outside the layout's cardinality. They are
refused (the default) or, with ``dead_letters="return"``, left out of the commit and handed
back with their reasons; the commit counts them (``stats["dead_letters"]``), so the rows read
plus the dead letters are the rows given. Nothing is dropped without a count.

A retry of the same ``batch_id`` after a failure is safe: a committed batch is not written
again (the shards of an attempt that failed before committing are deleted by the commit of the
retry). The same batch id with other rows is refused, since readers already saw the first.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from flow.errors import HandoffError
from flow.handoff.channel import Channel
from flow.handoff.format import Commit, ShardInfo
from flow.storage import Location

__all__ = ["DEAD_LETTER_SCHEMA", "WriteResult", "assign_buckets", "check_writer", "write_table"]

DEFAULT_BUCKETS = 16
DEFAULT_WRITER = "write_table"
DEAD_LETTER_SCHEMA = pa.schema([("row", pa.int64()), ("raw", pa.string()), ("reason", pa.string())])
"""A dead letter: the row's place in the input, the row as JSON, and why it cannot train."""
_SHOWN = 5  # reasons quoted in an error


@dataclass(frozen=True)
class WriteResult:
    """What :func:`write_table` did."""

    channel: str
    location: str
    batch_id: int
    commit: Commit | None
    """The commit written; None when the batch was already committed (a retry)."""
    rows: int
    """Rows of the batch in the channel (the committed ones, for a retry)."""
    dead_letters: pa.Table = field(repr=False)
    """Rows left out (:data:`DEAD_LETTER_SCHEMA`); empty unless ``dead_letters="return"``."""

    @property
    def replayed(self) -> bool:
        """Whether this batch id was already committed, so nothing was written."""
        return self.commit is None


def check_writer(channel: Channel, writer: str) -> None:
    """Refuse a channel whose last commit another writer made: its batch ids would be mistaken
    for replays of ``writer``'s (Spark's writer makes the same check)."""
    if not channel.exists():
        return
    ids = channel.commit_ids()
    owner = channel.commit(ids[-1]).writer if ids else None
    if owner and owner != writer:
        raise HandoffError(
            f"channel {channel.name!r} in {channel.root} was written by {owner}, not "
            f"{writer} (a reset checkpoint starts its batch ids again); write to a new "
            "channel or remove this one"
        )


def assign_buckets(
    num_rows: int, num_buckets: int, seed: int, keys: pa.Array | pa.ChunkedArray | None = None
) -> np.ndarray:
    """Each row's bucket: ``xxh64(str(key), seed) mod num_buckets`` (rows of one key share a
    bucket), or without keys round-robin over a seeded permutation (buckets differ by at most
    one row). A pure function of its arguments."""
    if num_buckets < 1:
        raise HandoffError(f"num_buckets={num_buckets}: give 1 or more")
    if keys is None:
        order = np.random.default_rng([seed, num_buckets]).permutation(num_rows)
        buckets = np.empty(num_rows, dtype=np.int64)
        buckets[order] = np.arange(num_rows) % num_buckets
        return buckets
    # Hash each distinct key once, in Python; the rows take their key's bucket by index.
    text = pc.fill_null(pc.cast(keys, pa.string()), "")
    distinct = pc.unique(text)
    hashes = np.array(
        [xxhash.xxh64_intdigest(v.encode(), seed) % num_buckets for v in distinct.to_pylist()],
        dtype=np.int64,
    )
    index = pc.index_in(text, value_set=distinct)
    return hashes[np.asarray(index.to_numpy(zero_copy_only=False), dtype=np.int64)]


def _as_table(data: Any) -> pa.Table:
    """A pyarrow Table of ``data`` (Table, RecordBatch or pandas DataFrame)."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if type(data).__module__.startswith("pandas") and hasattr(data, "columns"):
        try:
            return pa.Table.from_pandas(data, preserve_index=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise HandoffError(
                f"the DataFrame cannot become Arrow columns: {exc}; give that column one type "
                "(e.g. df[column].astype(...))"
            ) from exc
    raise HandoffError(
        f"write_table takes a pyarrow Table or RecordBatch or a pandas DataFrame, not "
        f"{type(data).__name__}; for a Spark DataFrame use flow.handoff.convert or a pipeline"
    )


def _normalized(table: pa.Table) -> pa.Table:
    """Types as Spark's writer gives them: timestamps in microseconds, UTC (naive ones read as
    UTC), plain strings and lists; so a channel's schema does not depend on the frame library."""
    fields = []
    for f in table.schema:
        kind = f.type
        if pa.types.is_timestamp(kind):
            kind = pa.timestamp("us", tz="UTC")
        elif pa.types.is_large_string(kind):
            kind = pa.string()
        elif pa.types.is_large_list(kind):
            kind = pa.list_(kind.value_type)
        fields.append(f.with_type(kind))
    schema = pa.schema(fields)
    if schema.equals(table.schema):
        return table.replace_schema_metadata(None)
    columns = []
    for column, f in zip(table.columns, schema, strict=True):
        if pa.types.is_timestamp(column.type) and column.type.tz is None:
            column = pc.assume_timezone(column, "UTC")
        columns.append(column.cast(f.type, safe=False))  # ns -> us truncates, as Spark does
    return pa.Table.from_arrays(columns, schema=schema)


def _layout_sizes(layout: Mapping[str, Any]) -> dict[str, int]:
    sizes = {}
    if layout.get("dense"):
        sizes["dense"] = len(layout["dense"])
    if layout.get("sparse"):
        sizes["sparse"] = len(layout["sparse"])
    for name, _cardinality, length in layout.get("sequences", ()):
        sizes[f"seq_{name}"] = int(length)
    return sizes


def _fixed_sizes(
    table: pa.Table,
    channel: Channel,
    given: Mapping[str, int] | None,
    layout: Mapping[str, Any] | None,
) -> dict[str, int]:
    """Which list columns are feature blocks (fixed-size lists), and of what width: the
    channel's, else those given, the layout's, or every list column whose rows are all of one
    non-zero length (Spark's rule)."""
    if channel.exists():
        return {
            f.name: f.type.list_size
            for f in channel.meta().schema
            if pa.types.is_fixed_size_list(f.type)
        }
    if given is not None:
        sizes = dict(given)
    elif layout is not None:
        sizes = _layout_sizes(layout)
    else:
        sizes = {}
        for f in table.schema:
            if pa.types.is_fixed_size_list(f.type):
                sizes[f.name] = f.type.list_size
            elif pa.types.is_list(f.type) and table.num_rows:
                lengths = pc.list_value_length(table.column(f.name))
                low, high = pc.min(lengths).as_py(), pc.max(lengths).as_py()
                if low is not None and low == high and low > 0:
                    sizes[f.name] = low
    for name in sizes:
        if name not in table.column_names:
            raise HandoffError(
                f"feature block {name!r} (from fixed_sizes or the layout) is not a column; "
                f"columns: {', '.join(table.column_names)}"
            )
        kind = table.schema.field(name).type
        if not (pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind)):
            raise HandoffError(
                f"feature block {name!r} must be a list column (one list per row), not {kind}"
            )
    return sizes


def _reasons(
    table: pa.Table,
    sizes: Mapping[str, int],
    label: str | None,
    layout: Mapping[str, Any] | None,
    required: tuple[str, ...] = (),
) -> dict[int, str]:
    """Why each row that cannot train cannot, by its place (rows that can are absent: a
    million good rows cost a few vectorized checks, not a million lists). ``required``:
    columns the channel holds without nulls."""
    reasons: dict[int, list[str]] = {}

    def add(mask: Any, text: str) -> None:
        for i in np.flatnonzero(np.asarray(mask, dtype=bool)).tolist():
            reasons.setdefault(i, []).append(text)

    for name in required:
        if name != label and name not in sizes:
            add(table.column(name).is_null().to_numpy(zero_copy_only=False), f"{name} is null")
    if label is not None:
        add(table.column(label).is_null().to_numpy(zero_copy_only=False), f"{label} is null")
    for name, size in sizes.items():
        column = table.column(name)
        nulls = column.is_null().to_numpy(zero_copy_only=False)
        add(nulls, f"{name} is null")
        lengths = pc.fill_null(pc.list_value_length(column), size).to_numpy(zero_copy_only=False)
        for i in np.flatnonzero(lengths != size).tolist():
            reasons.setdefault(i, []).append(f"{name} has {lengths[i]} values, not {size}")
        inner = pc.list_flatten(column)
        if inner.null_count:
            starts = np.concatenate([[0], np.cumsum(np.where(nulls, 0, lengths))])
            owner = np.searchsorted(starts, np.flatnonzero(inner.is_null()), side="right") - 1
            for i in np.unique(owner).tolist():
                reasons.setdefault(i, []).append(f"{name} holds a null")
    if layout is not None and layout.get("sparse") and "sparse" in sizes:
        cards = np.array([int(c) for _n, c in layout["sparse"]], dtype=np.int64)
        width = len(cards)
        good = np.ones(table.num_rows, dtype=bool)
        good[list(reasons)] = False
        ok = np.flatnonzero(good)
        if len(ok):
            values = pc.list_flatten(table.column("sparse").take(pa.array(ok)))
            block = np.asarray(values.to_numpy(zero_copy_only=False)).reshape(len(ok), width)
            bad = (block < 0) | (block >= cards)
            names = [n for n, _c in layout["sparse"]]
            for row, j in zip(*np.nonzero(bad), strict=True):
                reasons.setdefault(int(ok[row]), []).append(
                    f"sparse[{j}] ({names[j]}) = {block[row, j]} is outside 0..{cards[j] - 1}"
                )
    return {i: "; ".join(r) for i, r in sorted(reasons.items())}


def _dead_letters(table: pa.Table, reasons: dict[int, str]) -> pa.Table:
    bad = list(reasons)
    rows = table.take(pa.array(bad, type=pa.int64())).to_pylist() if bad else []
    return pa.table(
        {
            "row": pa.array(bad, pa.int64()),
            "raw": pa.array([json.dumps(r, default=str) for r in rows], pa.string()),
            "reason": pa.array([reasons[i] for i in bad], pa.string()),
        },
        schema=DEAD_LETTER_SCHEMA,
    )


def _check_columns(table: pa.Table, channel: Channel, sizes: Mapping[str, int]) -> pa.Table:
    """``table`` in the existing channel's column order and types; what differs is named."""
    schema = channel.meta().schema
    missing = [n for n in schema.names if n not in table.column_names]
    extra = [n for n in table.column_names if n not in schema.names]
    if missing or extra:
        raise HandoffError(
            f"channel {channel.name!r} in {channel.root} has columns {', '.join(schema.names)}; "
            + (f"this table lacks {', '.join(missing)}" if missing else "")
            + ("; " if missing and extra else "")
            + (f"this table also has {', '.join(extra)}" if extra else "")
            + ": give the same columns, or write to a new channel"
        )
    table = table.select(schema.names)
    columns = []
    for f in schema:
        column = table.column(f.name)
        if f.name in sizes or column.type == f.type:
            columns.append(column)  # feature blocks become fixed-size lists when written
            continue
        try:
            columns.append(column.cast(f.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise HandoffError(
                f"column {f.name!r} is {column.type}, and channel {channel.name!r} holds "
                f"{f.type} ({exc}); convert the column, or write to a new channel"
            ) from exc
    return pa.Table.from_arrays(columns, names=schema.names)


def _channel_schema(table: pa.Table, sizes: Mapping[str, int]) -> pa.Schema:
    fields = []
    for f in table.schema:
        if f.name in sizes:
            kind = f.type if pa.types.is_fixed_size_list(f.type) else f.type.value_type
            value = kind.value_type if pa.types.is_fixed_size_list(kind) else kind
            fields.append(pa.field(f.name, pa.list_(value, sizes[f.name]), False))
        else:
            fields.append(f)
    return pa.schema(fields)


def _next_batch(channel: Channel, writer: str) -> int:
    """The batch id after ``writer``'s last commit (0 for a new channel)."""
    if not channel.exists():
        return 0
    head = channel.head(writer)
    if head is not None:
        return head.batch_id + 1
    ids = channel.commit_ids()
    return ids[-1] + 1 if ids else 0


def write_table(
    where: str | os.PathLike[str] | Location,
    channel: str,
    data: Any,
    *,
    batch_id: int | None = None,
    writer: str = DEFAULT_WRITER,
    num_buckets: int | None = None,
    shuffle_key: str | None = None,
    seed: int = 0,
    label: str | None = None,
    event_time: str | None = None,
    layout: Mapping[str, Any] | None = None,
    fixed_sizes: Mapping[str, int] | None = None,
    compression: str | None = "lz4",
    compression_level: int | None = None,
    max_rows_per_shard: int = 256_000,
    max_unconsumed_bytes: int | None = None,
    source_positions: Mapping[str, Any] | None = None,
    dead_letters: Literal["raise", "return"] = "raise",
    close: bool = False,
) -> WriteResult:
    """Write ``data`` (a pyarrow Table or RecordBatch, or a pandas DataFrame) as batch
    ``batch_id`` of channel ``channel`` under ``where`` (a path or URI), and commit it.

    ``batch_id``: give it to make retries safe (the same id is written once); None takes the
    writer's next. Batch ids of one writer only grow. ``writer`` names the producer: a channel
    another writer committed to is refused. ``num_buckets`` (default: the channel's, else 16)
    must allow the reader's world sizes (a world size divides it). ``shuffle_key`` puts rows of
    one key in one bucket; without it rows are spread round-robin after a seeded shuffle.
    ``label``: rows with a null label are dead letters; its sum is the commit's ``positives``.
    ``event_time``: a timestamp column whose range the commit records. ``layout``
    (``flow.pipeline.Layout.to_dict()``) is recorded for trainers, and its blocks (``dense``,
    ``sparse``, ``seq_<name>``) checked row by row; ``fixed_sizes`` names feature blocks
    without a layout. ``dead_letters="return"`` commits the good rows and returns the others.
    ``close`` tells followers this was the last batch.
    """
    if dead_letters not in ("raise", "return"):
        raise HandoffError(f"dead_letters={dead_letters!r}: use 'raise' or 'return'")
    if max_rows_per_shard < 1:
        raise HandoffError(f"max_rows_per_shard={max_rows_per_shard}: give 1 or more")
    if batch_id is not None and batch_id < 0:
        raise HandoffError(f"batch_id={batch_id}: batch ids are 0 or more")
    if not writer:
        raise HandoffError("writer is empty: name the producer (e.g. 'nightly-export')")
    target = Channel(where if isinstance(where, Location) else os.fspath(where), channel)
    table = _normalized(_as_table(data))
    duplicated = sorted({n for n in table.column_names if table.column_names.count(n) > 1})
    if duplicated:
        raise HandoffError(f"columns {', '.join(duplicated)} appear twice; rename them")
    if not table.num_columns:
        raise HandoffError("the table has no columns; give at least one")
    for role, name in (("shuffle_key", shuffle_key), ("label", label), ("event_time", event_time)):
        if name is not None and name not in table.column_names:
            raise HandoffError(
                f"{role}={name!r} is not a column; columns: {', '.join(table.column_names)}"
            )
    if event_time is not None and not pa.types.is_timestamp(table.schema.field(event_time).type):
        raise HandoffError(
            f"event_time={event_time!r} is {table.schema.field(event_time).type}, not a "
            "timestamp; convert it (pandas.to_datetime) or leave event_time out"
        )
    check_writer(target, writer)
    sizes = _fixed_sizes(table, target, fixed_sizes, layout)
    if target.exists():
        table = _check_columns(table, target, sizes)
        meta = target.meta()
        if num_buckets is not None and num_buckets != meta.num_buckets:
            raise HandoffError(
                f"channel {channel!r} in {target.root} has {meta.num_buckets} buckets, not "
                f"{num_buckets}; leave num_buckets out, or write to a new channel"
            )
        buckets = meta.num_buckets
    else:
        buckets = num_buckets if num_buckets is not None else DEFAULT_BUCKETS
        if buckets < 1:
            raise HandoffError(f"num_buckets={buckets}: give 1 or more")
    given = table.num_rows
    required = (
        tuple(f.name for f in target.meta().schema if not f.nullable) if target.exists() else ()
    )
    reasons = _reasons(table, sizes, label, layout, required)
    letters = _dead_letters(table, reasons)
    if letters.num_rows and dead_letters == "raise":
        shown = "; ".join(
            f"row {r}: {why}"
            for r, why in zip(
                letters.column("row").to_pylist()[:_SHOWN],
                letters.column("reason").to_pylist()[:_SHOWN],
                strict=True,
            )
        )
        raise HandoffError(
            f"{letters.num_rows:,} of {given:,} rows cannot train ({shown}); fix them, or pass "
            "dead_letters='return' to commit the others and get these back"
        )
    if letters.num_rows:
        keep = np.ones(table.num_rows, dtype=bool)
        keep[list(reasons)] = False
        table = table.filter(pa.array(keep))
    batch = batch_id if batch_id is not None else _next_batch(target, writer)
    if target.exists() and target.committed(batch):
        done = target.commit(batch)
        if done.rows != table.num_rows:
            raise HandoffError(
                f"batch {batch} of channel {channel!r} is already committed with "
                f"{done.rows:,} rows, and this table has {table.num_rows:,}: a retry must give "
                "the same rows; new rows need a new batch_id"
            )
        return WriteResult(channel, target.root.uri, batch, None, done.rows, letters)
    schema = target.meta().schema if target.exists() else _channel_schema(table, sizes)
    target.create(
        schema,
        num_buckets=buckets,
        compression=compression,
        compression_level=compression_level,
        layout=layout,
        max_unconsumed_bytes=max_unconsumed_bytes,
    )
    target.reopen()
    target.wait_for_room()
    keys = table.column(shuffle_key) if shuffle_key is not None else None
    # A key's bucket is the same in every batch (so on the same rank of a world size); the
    # round-robin deal is drawn anew each batch.
    assigned = assign_buckets(
        table.num_rows, buckets, seed if keys is not None else seed + batch, keys
    )
    shards: list[ShardInfo] = []
    for bucket in range(buckets):
        rows = np.flatnonzero(assigned == bucket)
        if not len(rows):
            continue
        rng = np.random.default_rng([seed, batch, bucket])
        part = table.take(pa.array(rng.permutation(rows)))
        for start in range(0, part.num_rows, max_rows_per_shard):
            piece = part.slice(start, max_rows_per_shard).combine_chunks()
            shards.append(target.write_bucket(batch, bucket, piece, "table"))
    stats: dict[str, float] = {"dead_letters": letters.num_rows}
    kind = table.schema.field(label).type if label is not None else None
    if (
        label is not None
        and table.num_rows
        and (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind))
    ):
        stats["positives"] = round(float(pc.sum(table.column(label)).as_py() or 0.0))
    times: dict[str, str | None] = {"min": None, "max": None}
    if event_time is not None and table.num_rows:
        extremes = pc.min_max(table.column(event_time))
        low, high = extremes["min"].as_py(), extremes["max"].as_py()
        times = {
            "min": low.isoformat() if low else None,
            "max": high.isoformat() if high else None,
        }
    commit = target.add_commit(
        Commit(
            channel=channel,
            batch_id=batch,
            shards=tuple(shards),
            schema_fingerprint=target.meta().fingerprint,
            source_positions=dict(source_positions or {}),
            event_time=times,
            writer=writer,
            stats=stats,
            committed_at=datetime.now(UTC).isoformat(),
        )
    )
    if close:
        target.close()
    return WriteResult(
        channel, target.root.uri, batch, commit, table.num_rows if commit else 0, letters
    )
