"""A FeatureSpec fitted and compiled to Spark SQL: no Python on the per-row path.

``fit_state`` learns moments, quantile boundaries and vocabularies in three jobs, each the same
on any partitioning.
``training_rows`` turns enriched, labelled rows into the training-row layout: ``label``,
``weight``, ``dense`` (array<float>), ``sparse`` (array<int>), one ``seq_<name>`` per sequence
feature, ``ids`` (array<bigint>, raw ids of ``Id`` features) when there are any, then the
passthrough columns. Vocabulary lookups are broadcast hash joins with tables
held on the driver, or for a stream read from Parquet files written once (a map literal would be
a linear scan per row); quantile buckets are a balanced tree of comparisons.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from decimal import Decimal, localcontext
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from flow.pipeline.features import (
    NULL_ID,
    Bucketized,
    Cross,
    Feature,
    FeatureSpec,
    Hashed,
    HashedSequence,
    Id,
    Numeric,
    Vocabulary,
    feature_name,
)
from flow.pipeline.state import FeatureState, layout
from flow.storage import Location

__all__ = ["SHIPPED_BYTES", "Featurizer", "fit_state", "training_columns", "training_rows"]

_NULL = "\u0000"
SHIPPED_BYTES = 256 * 1024
"""A stream's vocabulary under this size (Arrow bytes) stays a local relation in its tasks: a
file scan's task costs more than a few KB shipped (10-80 ms against 0-10 ms a batch, locally)."""


def _hash_index(name: str, buckets: int, *values: Column) -> Column:
    """1 + hash mod (buckets - 1): indices 1..buckets-1, leaving 0 for null and padding."""
    hashed = F.xxhash64(F.lit(name), *values)
    return (F.lit(1) + F.pmod(hashed, F.lit(buckets - 1))).cast("int")


def _transformed(feature: Numeric | Bucketized) -> Column:
    """The feature's column as a double, clipped and log-scaled as it says; null stays null
    (``greatest``/``least`` skip nulls: unguarded, a null became the clip minimum, or 0 under
    ``log``, in the fit and in every row, instead of the fitted mean or bucket 0)."""
    raw = F.col(feature.column).cast("double")
    x = raw
    if feature.clip is not None:
        x = F.least(F.greatest(x, F.lit(feature.clip[0])), F.lit(feature.clip[1]))
    if feature.log:
        x = F.log1p(F.greatest(x, F.lit(0.0)))
    return x if x is raw else F.when(raw.isNotNull(), x)


def _bucket(x: Column, bounds: list[float], lo: int, hi: int) -> Column:
    """How many of ``bounds[lo:hi]`` are <= x, plus lo: a log2-deep tree of comparisons."""
    if lo == hi:
        return F.lit(lo)
    mid = (lo + hi) // 2
    return F.when(x >= F.lit(bounds[mid]), _bucket(x, bounds, mid + 1, hi)).otherwise(
        _bucket(x, bounds, lo, mid)
    )


def _sparse_index(feature: Feature, state: FeatureState) -> Column:
    name = feature_name(feature)
    if isinstance(feature, Hashed):
        column = F.col(feature.column)
        index = _hash_index(name, feature.buckets, column.cast("string"))
        return F.when(column.isNull(), F.lit(0)).otherwise(index)
    if isinstance(feature, Vocabulary):
        return F.coalesce(F.col(f"_vocab_{name}"), F.lit(0))
    if isinstance(feature, Bucketized):
        x = _transformed(feature)
        bounds = state.boundaries[name]
        return F.when(x.isNull(), F.lit(0)).otherwise(_bucket(x, bounds, 0, len(bounds)) + 1)
    if isinstance(feature, Cross):
        parts = [F.coalesce(F.col(c).cast("string"), F.lit(_NULL)) for c in feature.columns]
        return _hash_index(name, feature.buckets, *parts)
    raise TypeError(f"{name} is not a categorical feature")


def _dense_value(feature: Numeric, state: FeatureState) -> Column:
    name = feature_name(feature)
    x = _transformed(feature)
    mean, std = state.moments.get(name, (0.0, 1.0))
    fill = feature.fill if feature.fill is not None else mean
    x = F.coalesce(x, F.lit(fill))
    if feature.standardize:
        x = (x - F.lit(mean)) / F.lit(std if std > 0 else 1.0)
    return x.cast("float")


def _sequence(feature: HashedSequence) -> Column:
    name = feature_name(feature)
    values = F.coalesce(F.col(feature.column), F.array())
    hashed = F.transform(
        F.slice(values, 1, feature.max_length),
        lambda v: F.when(v.isNull(), F.lit(0)).otherwise(
            _hash_index(name, feature.buckets, v.cast("string"))
        ),
    )
    padding = F.array_repeat(F.lit(0), F.lit(feature.max_length) - F.size(hashed))
    return F.concat(hashed, padding).cast("array<int>")


class Featurizer:
    """A spec and its fitted state, ready to turn frames into training rows.

    The vocabulary tables are built once here, so a stream featurizing every micro-batch does
    not ship them from Python again each time. A stream gives ``tables``, a folder on storage
    every executor reads (its checkpoint's), for the vocabularies of :data:`SHIPPED_BYTES` or
    more: see :func:`_vocabulary_files`.
    """

    def __init__(
        self,
        spark: SparkSession,
        spec: FeatureSpec,
        state: FeatureState,
        tables: Location | None = None,
    ) -> None:
        self.spec = spec
        self.state = state
        self.columns = training_columns(spec, state)
        # Each vocabulary's table and join condition; the final select leaves its key column out.
        self._vocabularies: list[tuple[DataFrame, Column]] = []
        for feature in spec.features:
            if isinstance(feature, Vocabulary):
                name = feature_name(feature)
                values = _vocabulary_table(name, state)
                found = (
                    spark.createDataFrame(values)
                    if tables is None or values.nbytes < SHIPPED_BYTES
                    else _vocabulary_files(spark, tables, name, state, values)
                )
                on = F.col(feature.column).cast("string") == F.col(f"_key_{name}")
                self._vocabularies.append((F.broadcast(found), on))

    def apply(self, df: DataFrame, keep: Sequence[str] = ()) -> DataFrame:
        """Enriched, labelled rows in the training-row layout (and their ``keep`` columns)."""
        for table, on in self._vocabularies:
            df = df.join(table, on, "left")
        return df.select(*self.columns, *keep)


def _vocabulary_table(name: str, state: FeatureState) -> pa.Table:
    """A vocabulary as a table of (value, index from 1), from Arrow.

    Its rows are in the driver's memory already. A frame made from a Python list is an RDD of
    pickled rows that each broadcast of it (one per vocabulary per micro-batch) unpickles
    again: 0.1 s of task time each, against none."""
    known = state.vocabularies[name]
    values: list[str | None] = list(known) if known else [None]
    indices = range(1, len(values) + 1) if known else [0]
    return pa.table(
        {
            f"_key_{name}": pa.array(values, pa.string()),
            f"_vocab_{name}": pa.array(indices, pa.int32()),
        }
    )


def _vocabulary_files(
    spark: SparkSession, tables: Location, name: str, state: FeatureState, values: pa.Table
) -> DataFrame:
    """The vocabulary written once as a Parquet file under ``tables``, read back by Spark.

    A stream broadcasts every vocabulary again each micro-batch (a job each: a stream's plan
    is made anew every batch). From a local relation (``createDataFrame``), every task of that
    job carries the vocabulary's rows in its partition: 2.8 MB a task for 100,000 values, sent
    by the driver to the executors every batch ("a task of very large size"). Cached, the tasks
    still carry it (the cache's partitions are the local relation's). A file scan's tasks carry
    the file's path only. The folder is named by the state's version (a hash of its content):
    a restart finds the file written and leaves it as it is, and another state never reads it.
    """
    folder = tables.child(state.version)
    file = f"{re.sub(r'[^0-9A-Za-z_.-]', '_', name)}.parquet"
    if not folder.exists(file):
        sink = pa.BufferOutputStream()
        pq.write_table(values, sink)
        folder.write_bytes(file, sink.getvalue())
    # The schema given: reading infers nothing, which is a Spark job a file.
    ddl = f"`_key_{name}` string, `_vocab_{name}` int"
    return spark.read.schema(ddl).parquet(f"{folder.hadoop_uri}/{file}")


def training_columns(spec: FeatureSpec, state: FeatureState) -> list[Column]:
    """The training-row columns over a frame that already carries the vocabulary lookups."""
    layout(spec, state)  # raises if the state does not fit the spec
    dense = [_dense_value(f, state) for f in spec.features if isinstance(f, Numeric)]
    sparse = [
        _sparse_index(f, state)
        for f in spec.features
        if isinstance(f, Hashed | Vocabulary | Bucketized | Cross)
    ]
    weight = F.col(spec.weight) if isinstance(spec.weight, str) else F.lit(float(spec.weight))
    columns = [
        F.col(spec.label).cast("float").alias("label"),
        weight.cast("float").alias("weight"),
        F.array(*dense).cast("array<float>").alias("dense"),
        F.array(*sparse).cast("array<int>").alias("sparse"),
    ]
    columns += [
        _sequence(f).alias(f"seq_{feature_name(f)}")
        for f in spec.of_kind("sequence")
        if isinstance(f, HashedSequence)
    ]
    ids = [
        F.coalesce(F.col(f.column).cast("bigint"), F.lit(NULL_ID).cast("bigint"))
        for f in spec.features
        if isinstance(f, Id)
    ]
    if ids:  # raw ids, unchanged: the trainer's tables map them (trainers.dynamic)
        columns.append(F.array(*ids).cast("array<bigint>").alias("ids"))
    columns += [F.col(c) for c in spec.passthrough if c != spec.label]
    return columns


def training_rows(df: DataFrame, spec: FeatureSpec, state: FeatureState) -> DataFrame:
    """Enriched, labelled rows in the training-row layout (see :class:`Featurizer`)."""
    return Featurizer(df.sparkSession, spec, state).apply(df)


_EXACT = "decimal(38,10)"
"""Sums for the moments: decimal addition is exact, so they come out the same in any order, on
any partitioning (a double sum's last bits follow the order partitions are merged in). Ten
decimal places; values up to ~1e9 (squares ~1e18) over ~1e9 rows fit 38 digits."""


def _fit_moments(df: DataFrame, features: list[Numeric]) -> dict[str, tuple[float, float]]:
    """Mean and population deviation of each (transformed) numeric feature, deterministically."""
    if not features:
        return {}
    aggregates: list[Column] = []
    for feature in features:
        name = feature_name(feature)
        x = _transformed(feature)
        aggregates += [
            F.count(x).alias(f"n_{name}"),
            F.sum(x.cast(_EXACT)).alias(f"s_{name}"),
            F.sum((x * x).cast(_EXACT)).alias(f"ss_{name}"),
        ]
    row = df.agg(*aggregates).first()
    values: dict[str, Any] = row.asDict() if row is not None else {}
    moments = {}
    with localcontext() as exact:
        exact.prec = 80
        for feature in features:
            name = feature_name(feature)
            n, total, squares = values[f"n_{name}"], values[f"s_{name}"], values[f"ss_{name}"]
            if not n:
                moments[name] = (0.0, 1.0)
                continue
            mean = Decimal(total) / n
            variance = max(Decimal(squares) / n - mean * mean, Decimal(0))
            std = float(variance.sqrt())
            moments[name] = (float(mean), std if std else 1.0)
    return moments


def _value_counts(df: DataFrame, values: list[tuple[str, Column]]) -> DataFrame:
    """``(f, v, count)``: how often each non-null value ``v`` of each named column ``f`` occurs,
    every column counted in one pass (the columns exploded into pairs)."""
    named = [F.struct(F.lit(name).alias("f"), column.alias("v")) for name, column in values]
    pairs = df.select(F.explode(F.array(*named)).alias("p")).select("p.f", "p.v")
    return pairs.where(F.col("v").isNotNull()).groupBy("f", "v").count()


def _per_feature(features: Sequence[Feature], value: Callable[[Any], Any]) -> Column:
    """``value(feature)`` of the feature named in column ``f``."""
    found = F.lit(None)
    for feature in features:
        found = F.when(F.col("f") == feature_name(feature), F.lit(value(feature))).otherwise(found)
    return found


def _fit_boundaries(df: DataFrame, features: list[Bucketized]) -> dict[str, list[float]]:
    """Each bucketized feature's exact quantiles, the smallest value whose share of values at or
    below it reaches i / buckets (i = 1 .. buckets - 1), duplicates dropped.

    Counted per distinct value, then summed in value order per feature: the same boundaries on
    any partitioning (``percentile_approx`` merges its sketches in the order tasks finish, and
    gave 259 of 350,000 rows another bucket on a cluster than on one machine). Memory grows with
    the distinct values of one feature, held sorted by one task (Spark spills it).
    """
    if not features:
        return {}
    counts = _value_counts(df, [(feature_name(f), _transformed(f)) for f in features])
    by_value = Window.partitionBy("f").orderBy("v")
    running = counts.select(
        "f",
        "v",
        "count",
        _per_feature(features, lambda f: f.buckets).cast("bigint").alias("b"),
        F.sum("count").over(by_value.rowsBetween(Window.unboundedPreceding, 0)).alias("upto"),
        F.sum("count").over(Window.partitionBy("f")).alias("total"),
    ).withColumn("before", F.col("upto") - F.col("count"))
    # v is the boundary of quantile i when the values below it are under i / b of all and the
    # values up to it reach that: some i in 1 .. b - 1 lies in (before * b / total, upto * b /
    # total]. Integer division: exact at any count.
    crossing = running.where(
        F.expr("upto * b div total > before * b div total AND before * b < total * (b - 1)")
    )
    found: dict[str, set[float]] = {feature_name(f): set() for f in features}
    for row in crossing.select("f", "v").collect():
        found[row["f"]].add(float(row["v"]))
    return {name: sorted(values) for name, values in found.items()}


def _fit_vocabularies(df: DataFrame, spec: FeatureSpec) -> dict[str, list[str]]:
    features = [f for f in spec.features if isinstance(f, Vocabulary)]
    if not features:
        return {}
    strings = [(feature_name(f), F.col(f.column).cast("string")) for f in features]
    counts = _value_counts(df, strings)
    min_frequency = _per_feature(features, lambda f: f.min_frequency)
    max_size = _per_feature(features, lambda f: f.max_size)
    rank = F.row_number().over(Window.partitionBy("f").orderBy(F.desc("count"), F.asc("v")))
    kept = (
        counts.where(F.col("count") >= min_frequency)
        .withColumn("rank", rank)
        .where(F.col("rank") <= max_size)
        .select("f", "v", "rank")
    )
    vocabularies: dict[str, list[tuple[int, str]]] = {feature_name(f): [] for f in features}
    for row in kept.collect():
        vocabularies[row["f"]].append((int(row["rank"]), str(row["v"])))
    return {name: [v for _, v in sorted(ranked)] for name, ranked in vocabularies.items()}


def fit_state(
    df: DataFrame, spec: FeatureSpec, fitted_on: dict[str, Any] | None = None
) -> FeatureState:
    """Fit every stateful feature of ``spec`` on ``df`` (enriched, labelled rows)."""
    numeric = [f for f in spec.features if isinstance(f, Numeric) and f.fitted]
    moments = _fit_moments(df, numeric)
    boundaries = _fit_boundaries(df, [f for f in spec.features if isinstance(f, Bucketized)])
    vocabularies = _fit_vocabularies(df, spec)
    return FeatureState(
        spec_name=spec.name,
        spec_fingerprint=spec.fingerprint,
        vocabularies=vocabularies,
        moments=moments,
        boundaries=boundaries,
        fitted_on={"fitted_at": datetime.now(UTC).isoformat(), **(fitted_on or {})},
    )
