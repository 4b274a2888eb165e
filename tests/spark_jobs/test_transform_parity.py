"""The Python transform (flow.transform) against the compiled Spark SQL, over random raw rows.

Hypothesis draws rows (nulls, NaN, infinities, extreme integers, unicode and empty strings,
null array elements) and a fitted state drawn from them (cut points that are values of the rows,
so ``x == boundary`` happens; vocabularies of some of the values); Spark featurizes them on the
test session's SparkSession and every feature of every row must be equal, bit for bit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from flow.pipeline import (
    Bucketized,
    Cross,
    FeatureSpec,
    Hashed,
    HashedSequence,
    Id,
    Numeric,
    Vocabulary,
)
from flow.pipeline.features import feature_name
from flow.pipeline.state import FeatureState
from flow.transform import FeatureTransform
from flow.transform.consistency import compare
from flow.transform.spark_semantics import log1p
from spark_jobs.features import Featurizer

pytestmark = pytest.mark.integration

SPEC = FeatureSpec(
    name="parity",
    features=(
        Numeric("a", clip=(-2, 2)),
        Numeric("b", log=True),
        Numeric("i", fill=7.0, standardize=False),
        Numeric("a", clip=(0, 10), log=True, name="a_log"),
        Numeric("l", standardize=False),
        Numeric("b", clip=(1, 3), log=True, fill=0.5, name="b_filled"),
        Bucketized("b", buckets=5, log=True, name="b_bucket"),
        Bucketized("a", buckets=4, clip=(-1, 1), name="a_bucket"),
        Bucketized("i", buckets=3, name="i_bucket"),
        Vocabulary("s", min_frequency=2),
        Vocabulary("l", name="l_vocab"),
        Vocabulary("flag"),
        Hashed("s", buckets=50, name="s_hash"),
        Hashed("l", buckets=1 << 18, name="l_hash"),
        Hashed("i", buckets=7, name="i_hash"),
        Hashed("flag", buckets=3, name="flag_hash"),
        Cross(("s", "t"), buckets=64),
        Cross(("s", "l", "flag"), buckets=1000, name="three"),
        HashedSequence("seq", max_length=4, buckets=32),
        HashedSequence("lseq", max_length=2, buckets=1 << 16),
        Id("l", name="l_id"),
        Id("i", name="i_id"),
    ),
    weight="w",
    passthrough=("id",),
)
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("a", pa.float64()),
        ("b", pa.float64()),
        ("i", pa.int32()),
        ("l", pa.int64()),
        ("s", pa.string()),
        ("t", pa.string()),
        ("flag", pa.bool_()),
        ("seq", pa.list_(pa.string())),
        ("lseq", pa.list_(pa.int64())),
        ("label", pa.float64()),
        ("w", pa.float64()),
    ]
)

_floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-5, 20),
    st.sampled_from([0.0, -0.0, 1.0, 2.0, 3.0, -1.0, 1e-300, 1e300]),
)
_text = st.one_of(st.sampled_from(["x", "y", "", "\x00", "é"]), st.text(max_size=4))
_long = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-3, 3))


def _maybe(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), values)


_row = st.tuples(
    _maybe(_floats),
    _maybe(_floats),
    _maybe(st.integers(-(2**31), 2**31 - 1) | st.integers(0, 5)),
    _maybe(_long),
    _maybe(_text),
    _maybe(_text),
    _maybe(st.booleans()),
    _maybe(st.lists(_maybe(_text), max_size=6)),
    _maybe(st.lists(_maybe(_long), max_size=3)),
    st.sampled_from([0.0, 1.0]),
    st.floats(0.1, 100),
)


def _table(rows: list[tuple[Any, ...]]) -> pa.Table:
    columns = list(zip(*rows, strict=True)) if rows else [()] * 11
    data = [list(range(len(rows))), *map(list, columns)]
    return pa.table(dict(zip(SCHEMA.names, data, strict=True)), schema=SCHEMA)


def _transformed(x: float, clip: tuple[float, float] | None, log: bool) -> float:
    """A value as Spark's clip and log leave it (NaN above every number)."""
    if clip is not None:
        x = clip[1] if math.isnan(x) else min(max(x, clip[0]), clip[1])
    return log1p(max(x, 0.0)) if log and not math.isnan(x) else x


def _spark_text(value: Any) -> str:
    """``cast(value AS string)`` as Spark writes it for these columns."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _state(table: pa.Table, data: st.DataObject) -> FeatureState:
    """A state drawn from the rows: moments anywhere, cut points and vocabularies of their
    values."""
    moments: dict[str, tuple[float, float]] = {}
    boundaries: dict[str, list[float]] = {}
    vocabularies: dict[str, list[str]] = {}
    for f in SPEC.features:
        name = feature_name(f)
        if isinstance(f, Numeric) and f.fitted:
            moments[name] = (data.draw(st.floats(-10, 10)), data.draw(st.floats(0.01, 10)))
        elif isinstance(f, Bucketized):
            values = [v for v in table.column(f.column).to_pylist() if v is not None]
            cuts = sorted(
                c for c in {_transformed(float(v), f.clip, f.log) for v in values} if c == c
            )  # c == c: not NaN, which no cut point is
            drawn = data.draw(st.sets(st.sampled_from(cuts), max_size=4)) if cuts else set()
            boundaries[name] = sorted(drawn)
        elif isinstance(f, Vocabulary):
            texts = sorted(
                {_spark_text(v) for v in table.column(f.column).to_pylist() if v is not None}
            )
            some = st.lists(st.sampled_from(texts), unique=True, max_size=5)
            vocabularies[name] = data.draw(some) if texts else []
    return FeatureState(SPEC.name, SPEC.fingerprint, vocabularies, moments, boundaries)


@settings(
    max_examples=8,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(rows=st.lists(_row, min_size=1, max_size=25), data=st.data())
def test_python_transform_equals_spark_sql_for_every_feature_kind(
    spark: SparkSession, rows: list[tuple[Any, ...]], data: st.DataObject
) -> None:
    table = _table(rows)
    state = _state(table, data)
    frame = spark.createDataFrame(table)
    featurized = Featurizer(spark, SPEC, state).apply(frame)
    by_spark = featurized.toArrow().sort_by("id")
    by_python = FeatureTransform(SPEC, state).apply(table)

    report = compare(SPEC, by_spark, by_python, by_spark.column("id").to_pylist(), rel=0.0)
    assert report.ok, "\n".join(report.lines())
    # Stronger than the check's 1e-6: the same float32 bits (NaN where Spark has NaN).
    for column in ("dense", "sparse", "seq_seq", "seq_lseq"):
        spark_values = np.asarray(by_spark.column(column).to_pylist(), dtype=np.float64)
        python_values = np.asarray(by_python.column(column).to_pylist(), dtype=np.float64)
        np.testing.assert_array_equal(spark_values, python_values)
    # The raw ids of Id features, extreme ones too, as int64 (a double would round them).
    assert by_spark.column("ids").to_pylist() == by_python.column("ids").to_pylist()
