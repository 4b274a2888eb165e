"""The Arrow batches Spark sends to Python tasks: the same bounds, without Spark's per-row check."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_type

from spark_jobs.arrow_batches import (
    MAX_BYTES,
    MAX_RECORDS,
    batch_limits,
    parse_bytes,
    row_width,
    sized_batches,
)

_PRIMITIVES = [
    T.BooleanType(),
    T.ByteType(),
    T.ShortType(),
    T.IntegerType(),
    T.LongType(),
    T.FloatType(),
    T.DoubleType(),
    T.DateType(),
    T.TimestampType(),
]


def _arrow_column(
    kind: T.DataType, rows: int, length: int | None, rng: np.random.Generator
) -> pa.Array:
    """A column as Spark's Arrow vectors hold it: lists with offsets, a validity bitmap each."""
    if isinstance(kind, T.ArrayType):
        assert length is not None
        values = _arrow_column(kind.elementType, rows * length, None, rng)
        offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * length)
        mask = pa.array(np.zeros(rows, dtype=bool))
        return pa.ListArray.from_arrays(offsets, values, mask=mask)
    arrow = to_arrow_type(kind)
    raw = rng.integers(0, 2**7, rows)
    mask = np.zeros(rows, dtype=bool)
    if pa.types.is_boolean(arrow):
        return pa.array(raw % 2 == 0, mask=mask)
    if pa.types.is_timestamp(arrow) or pa.types.is_date(arrow):
        raw_type = pa.int64() if pa.types.is_timestamp(arrow) else pa.int32()
        return pa.array(raw, raw_type, mask=mask).cast(arrow)
    return pa.array(raw, mask=mask).cast(arrow)


@settings(max_examples=60, deadline=None)
@given(
    columns=st.lists(
        st.tuples(st.sampled_from(_PRIMITIVES), st.none() | st.integers(0, 40)),
        min_size=1,
        max_size=8,
    ),
    rows=st.integers(1, 300),
    seed=st.integers(0, 2**16),
)
def test_the_width_bounds_the_bytes_of_every_row(
    columns: list[tuple[T.DataType, int | None]], rows: int, seed: int
) -> None:
    schema = T.StructType(
        [
            T.StructField(f"c{i}", T.ArrayType(kind) if length is not None else kind)
            for i, (kind, length) in enumerate(columns)
        ]
    )
    lengths = {f"c{i}": length for i, (_, length) in enumerate(columns) if length is not None}
    rng = np.random.default_rng(seed)
    table = pa.table(
        {f.name: _arrow_column(f.dataType, rows, lengths.get(f.name), rng) for f in schema.fields}
    )
    width = row_width(schema, lengths)
    assert width is not None
    assert table.nbytes <= rows * width + 8 * len(columns)  # + bitmap rounding per vector


def test_columns_of_unknown_width_have_no_bound() -> None:
    floats = T.ArrayType(T.FloatType())
    assert row_width(T.StructType([T.StructField("s", T.StringType())]), {}) is None
    assert row_width(T.StructType([T.StructField("b", T.BinaryType())]), {}) is None
    assert row_width(T.StructType([T.StructField("a", floats)]), {}) is None  # length unknown
    nested = T.StructType([T.StructField("x", T.ArrayType(floats))])
    assert row_width(nested, {"x": 3}) is None  # inner lengths unknown
    kv = T.StructType([T.StructField("m", T.MapType(T.StringType(), T.LongType()))])
    assert row_width(kv, {}) is None
    assert row_width(T.StructType([T.StructField("a", floats)]), {"a": 13}) == 58  # 4+13x(4+1/8)


def test_limits_keep_the_byte_bound_through_the_record_count() -> None:
    assert batch_limits(300, 10_000, 64 << 20) == {MAX_RECORDS: "10000", MAX_BYTES: "2147483647"}
    assert batch_limits(10_000, 10_000, 1 << 20) == {MAX_RECORDS: "104", MAX_BYTES: "2147483647"}
    assert batch_limits(10 << 20, 10_000, 1 << 20)[MAX_RECORDS] == "1"  # a row above the limit
    assert batch_limits(None, 10_000, 64 << 20) == {}
    assert batch_limits(300, 0, 64 << 20) == {}  # no record limit to lean on
    assert batch_limits(300, 10_000, 2**31 - 1) == {}  # Spark's check is off already


@pytest.mark.parametrize(
    ("text", "expected"),
    [("67108864b", 64 << 20), ("64m", 64 << 20), ("64MB", 64 << 20), ("1g", 1 << 30), ("512", 512)],
)
def test_spark_byte_sizes_parse(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


def test_a_byte_size_spark_would_not_take_is_refused() -> None:
    with pytest.raises(ValueError, match="not a Spark byte size"):
        parse_bytes("sixty-four")


@pytest.mark.integration
def test_batches_stay_under_the_byte_limit_and_the_settings_come_back(
    spark: SparkSession,
) -> None:
    df = spark.range(5000, numPartitions=2).select(
        "id", F.array(*[F.col("id") + j for j in range(100)]).alias("block")
    )
    seen: list[tuple[int, int]] = []
    schema = pa.schema([("rows", pa.int64()), ("bytes", pa.int64())])

    def sizes(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield pa.record_batch([[batch.num_rows], [batch.nbytes]], schema=schema)

    before = {key: spark.conf.get(key) for key in (MAX_RECORDS, MAX_BYTES)}
    spark.conf.set(MAX_BYTES, "64k")
    try:
        with sized_batches(spark, df.schema, {"block": 100}) as limits:
            seen = [
                (r["rows"], r["bytes"])
                for r in df.mapInArrow(sizes, "rows long, bytes long").collect()
            ]
        assert spark.conf.get(MAX_BYTES) == "64k"
    finally:
        for key, value in before.items():
            if value is not None:
                spark.conf.set(key, value)
    assert limits[MAX_BYTES] == "2147483647"
    assert sum(rows for rows, _ in seen) == 5000
    assert max(rows for rows, _ in seen) == int(limits[MAX_RECORDS]) < 10_000
    assert max(size for _, size in seen) <= 64 << 10
