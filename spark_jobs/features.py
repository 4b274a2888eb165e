"""A FeatureSpec fitted and compiled to Spark SQL: no Python on the per-row path.

``fit_state`` learns vocabularies, moments and quantile boundaries in two aggregation jobs.
``training_rows`` turns enriched, labelled rows into the training-row layout: ``label``,
``weight``, ``dense`` (array<float>), ``sparse`` (array<int>), one ``seq_<name>`` per sequence
feature, then the passthrough columns. Vocabulary lookups are broadcast hash joins (a map
literal would be a linear scan per row); quantile buckets are a balanced tree of comparisons.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from flow.pipeline.features import (
    Bucketized,
    Cross,
    Feature,
    FeatureSpec,
    Hashed,
    HashedSequence,
    Numeric,
    Vocabulary,
    feature_name,
)
from flow.pipeline.state import FeatureState, layout

__all__ = ["Featurizer", "fit_state", "training_columns", "training_rows"]

_NULL = "\u0000"


def _hash_index(name: str, buckets: int, *values: Column) -> Column:
    """1 + hash mod (buckets - 1): indices 1..buckets-1, leaving 0 for null and padding."""
    hashed = F.xxhash64(F.lit(name), *values)
    return (F.lit(1) + F.pmod(hashed, F.lit(buckets - 1))).cast("int")


def _transformed(feature: Numeric | Bucketized) -> Column:
    x = F.col(feature.column).cast("double")
    if feature.clip is not None:
        x = F.least(F.greatest(x, F.lit(feature.clip[0])), F.lit(feature.clip[1]))
    if feature.log:
        x = F.log1p(F.greatest(x, F.lit(0.0)))
    return x


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
    not ship them from Python again each time.
    """

    def __init__(self, spark: SparkSession, spec: FeatureSpec, state: FeatureState) -> None:
        self.spec = spec
        self.state = state
        self.columns = training_columns(spec, state)
        self._vocabularies: list[tuple[Vocabulary, DataFrame]] = []
        for feature in spec.features:
            if isinstance(feature, Vocabulary):
                name = feature_name(feature)
                rows: list[tuple[str | None, int]] = [
                    (v, i + 1) for i, v in enumerate(state.vocabularies[name])
                ]
                table = spark.createDataFrame(
                    rows or [(None, 0)], f"_key_{name} string, _vocab_{name} int"
                )
                self._vocabularies.append((feature, F.broadcast(table)))

    def apply(self, df: DataFrame) -> DataFrame:
        """Enriched, labelled rows in the training-row layout."""
        for feature, table in self._vocabularies:
            name = feature_name(feature)
            key = F.col(feature.column).cast("string")
            df = df.join(table, key == F.col(f"_key_{name}"), "left").drop(f"_key_{name}")
        return df.select(*self.columns)


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
    columns += [F.col(c) for c in spec.passthrough if c != spec.label]
    return columns


def training_rows(df: DataFrame, spec: FeatureSpec, state: FeatureState) -> DataFrame:
    """Enriched, labelled rows in the training-row layout (see :class:`Featurizer`)."""
    return Featurizer(df.sparkSession, spec, state).apply(df)


def _fit_numeric(
    df: DataFrame, spec: FeatureSpec
) -> tuple[dict[str, tuple[float, float]], dict[str, list[float]]]:
    aggregates: list[Column] = []
    for feature in spec.features:
        name = feature_name(feature)
        if isinstance(feature, Numeric) and feature.fitted:
            x = _transformed(feature)
            aggregates += [F.avg(x).alias(f"mean_{name}"), F.stddev_pop(x).alias(f"std_{name}")]
        elif isinstance(feature, Bucketized):
            quantiles = [i / feature.buckets for i in range(1, feature.buckets)]
            x = _transformed(feature)
            aggregates.append(F.percentile_approx(x, quantiles, 10_000).alias(f"q_{name}"))
    if not aggregates:
        return {}, {}
    row = df.agg(*aggregates).first()
    values: dict[str, Any] = row.asDict() if row is not None else {}
    moments = {}
    boundaries = {}
    for feature in spec.features:
        name = feature_name(feature)
        if isinstance(feature, Numeric) and feature.fitted:
            mean = values.get(f"mean_{name}")
            std = values.get(f"std_{name}")
            moments[name] = (float(mean) if mean is not None else 0.0, float(std) if std else 1.0)
        elif isinstance(feature, Bucketized):
            cut = values.get(f"q_{name}") or []
            boundaries[name] = sorted({float(b) for b in cut if b is not None})
    return moments, boundaries


def _fit_vocabularies(df: DataFrame, spec: FeatureSpec) -> dict[str, list[str]]:
    features = [f for f in spec.features if isinstance(f, Vocabulary)]
    if not features:
        return {}
    pairs = df.select(
        F.explode(
            F.array(
                *[
                    F.struct(
                        F.lit(feature_name(f)).alias("f"), F.col(f.column).cast("string").alias("v")
                    )
                    for f in features
                ]
            )
        ).alias("p")
    ).select("p.f", "p.v")
    counts = pairs.where(F.col("v").isNotNull()).groupBy("f", "v").count()
    min_frequency = F.lit(1)
    max_size = F.lit(1)
    for f in features:
        min_frequency = F.when(F.col("f") == feature_name(f), F.lit(f.min_frequency)).otherwise(
            min_frequency
        )
        max_size = F.when(F.col("f") == feature_name(f), F.lit(f.max_size)).otherwise(max_size)
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
    moments, boundaries = _fit_numeric(df, spec)
    vocabularies = _fit_vocabularies(df, spec)
    return FeatureState(
        spec_name=spec.name,
        spec_fingerprint=spec.fingerprint,
        vocabularies=vocabularies,
        moments=moments,
        boundaries=boundaries,
        fitted_on={"fitted_at": datetime.now(UTC).isoformat(), **(fitted_on or {})},
    )
