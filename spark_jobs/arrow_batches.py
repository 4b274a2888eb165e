"""How many rows Spark puts in each Arrow batch it sends to a Python task, and at what cost.

Spark cuts the rows it sends to ``mapInArrow`` by two limits:
``spark.sql.execution.arrow.maxRecordsPerBatch`` (10,000) and ``...maxBytesPerBatch`` (64 MiB).
It checks the byte limit by summing every Arrow vector's size after *each row*, unless the limit
is exactly ``2**31 - 1``. For the handoff export's Criteo-shaped rows (two array columns) that
check was 12 % of the JVM's task time (async-profiler, ``flow bench handoff`` shapes).

When every column has a known width (numbers, timestamps, arrays of a fixed length), a batch's
bytes are at most its rows times that width: a record limit of ``max_bytes // width`` keeps the
same bound, and the per-row check can go. Columns of unknown width (strings, binary, maps,
arrays of varying length) keep Spark's check.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from pyspark.sql import SparkSession
from pyspark.sql import types as T

__all__ = [
    "MAX_BYTES",
    "MAX_RECORDS",
    "batch_limits",
    "parse_bytes",
    "restore",
    "row_width",
    "size_batches",
    "sized_batches",
]

MAX_RECORDS = "spark.sql.execution.arrow.maxRecordsPerBatch"
MAX_BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"
_UNCHECKED = 2**31 - 1
"""The one byte limit at which Spark skips its per-row size check."""

_FIXED: dict[type[T.DataType], float] = {
    T.BooleanType: 1 / 8,
    T.ByteType: 1,
    T.ShortType: 2,
    T.IntegerType: 4,
    T.LongType: 8,
    T.FloatType: 4,
    T.DoubleType: 8,
    T.DateType: 4,
    T.TimestampType: 8,
    T.TimestampNTZType: 8,
    T.DecimalType: 16,
    T.NullType: 0,
}
_VALIDITY = 1 / 8
"""One validity bit per value of every vector (Spark's vectors are all nullable)."""
_OFFSET = 4
"""A list vector's offset per row."""


def _width(kind: T.DataType, length: int | None) -> float | None:
    if type(kind) in _FIXED:
        return _FIXED[type(kind)] + _VALIDITY
    if isinstance(kind, T.StructType):
        fields = _sum(_width(f.dataType, None) for f in kind.fields)
        return None if fields is None else _VALIDITY + fields
    if isinstance(kind, T.ArrayType) and length is not None:
        element = _width(kind.elementType, None)
        return None if element is None else _OFFSET + _VALIDITY + length * element
    return None  # strings, binary, maps, arrays of unknown length


def _sum(widths: Iterator[float | None]) -> float | None:
    total = 0.0
    for width in widths:
        if width is None:
            return None
        total += width
    return total


def row_width(schema: T.StructType, array_lengths: Mapping[str, int]) -> int | None:
    """An upper bound of one row's bytes in Spark's Arrow vectors; None if it has no bound.

    ``array_lengths``: the length of every row's array in those top-level array columns.
    """
    width = _sum(_width(f.dataType, array_lengths.get(f.name)) for f in schema.fields)
    return None if width is None else max(1, int(width) + 1)


def batch_limits(width: int | None, max_records: int, max_bytes: int) -> dict[str, str]:
    """Settings that keep Spark's bounds on an Arrow batch without its per-row byte check.

    Empty when nothing can be saved: rows of unknown width, no record limit to lean on, or the
    check already off.
    """
    if width is None or max_records <= 0 or max_bytes >= _UNCHECKED:
        return {}
    records = max(1, min(max_records, max_bytes // width))
    return {MAX_RECORDS: str(records), MAX_BYTES: str(_UNCHECKED)}


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def parse_bytes(text: str) -> int:
    """A Spark byte size (``67108864b``, ``64m``, ``1g``, ``512kb``) in bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([kmgtp]?)b?\s*", text.lower())
    if match is None:
        raise ValueError(f"{text!r} is not a Spark byte size (e.g. 64m)")
    return int(match.group(1)) * _UNITS[match.group(2)]


def size_batches(
    spark: SparkSession, schema: T.StructType, array_lengths: Mapping[str, int]
) -> dict[str, str | None]:
    """Arrow batches of rows of ``schema`` cut by record count alone, from now on (the settings
    are read when an action plans its query); what they were before, for :func:`restore`."""
    limits = batch_limits(
        row_width(schema, array_lengths),
        int(spark.conf.get(MAX_RECORDS) or 0),
        parse_bytes(spark.conf.get(MAX_BYTES) or str(_UNCHECKED)),
    )
    before: dict[str, str | None] = {key: spark.conf.get(key) for key in limits}
    for key, setting in limits.items():
        spark.conf.set(key, setting)
    return before


def restore(spark: SparkSession, before: Mapping[str, str | None]) -> None:
    """The session's settings back as :func:`size_batches` found them."""
    for key, previous in before.items():
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)


@contextmanager
def sized_batches(
    spark: SparkSession, schema: T.StructType, array_lengths: Mapping[str, int]
) -> Iterator[dict[str, str]]:
    """Within the block, Arrow batches of rows of ``schema`` are cut by record count alone.

    The settings are the session's for the duration of the block, read when an action plans
    its query: run the action inside. They are restored afterwards. Yields what was set.
    """
    before = size_batches(spark, schema, array_lengths)
    try:
        yield {key: str(spark.conf.get(key)) for key in before}
    finally:
        restore(spark, before)
