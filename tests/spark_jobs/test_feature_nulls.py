"""Every feature kind and option, over random rows with nulls, against a pure-Python reference of
the documented semantics (docs/pipelines.md, Features): the fit and the transform.

The stream featurizes each micro-batch with the same :class:`spark_jobs.features.Featurizer`,
so what holds here holds there.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from collections import Counter
from typing import Any

import pytest
from pyspark.sql import SparkSession

from flow.pipeline import (
    Bucketized,
    Cross,
    FeatureSpec,
    Hashed,
    HashedSequence,
    Numeric,
    Vocabulary,
)
from flow.pipeline.features import Feature, feature_name
from flow.pipeline.state import FeatureState
from spark_jobs.features import fit_state, training_rows

pytestmark = pytest.mark.integration

SPEC = FeatureSpec(
    name="nulls",
    features=(
        Numeric("a", clip=(-2, 2)),
        Numeric("b", log=True),
        Numeric("c", fill=7.0, standardize=False),
        Numeric("d", clip=(0, 10), log=True),
        Numeric("e", standardize=False),  # nulls: the fitted mean
        Bucketized("b", buckets=5, log=True, name="b_bucket"),
        Bucketized("a", buckets=4, clip=(-1, 1), name="a_bucket"),
        Vocabulary("s", min_frequency=2),
        Hashed("s", buckets=50, name="s_hash"),
        Cross(("s", "t"), buckets=64),
        HashedSequence("seq", max_length=4, buckets=32),
    ),
    passthrough=("id",),
)
SCHEMA = (
    "id long, a double, b double, c double, d double, e double, s string, t string, "
    "seq array<string>, label double"
)


def _rows(seed: int, n: int) -> list[tuple[Any, ...]]:
    pick = random.Random(seed)
    share = pick.choice([0.1, 0.4, 0.9])  # from a few nulls to almost all

    def maybe(value: Any) -> Any:
        return None if pick.random() < share else value

    def sequence() -> list[str | None] | None:
        items: list[str | None] = [maybe(pick.choice("pqrstu")) for _ in range(pick.randint(0, 6))]
        return None if pick.random() < share else items

    return [
        (
            i,
            maybe(pick.gauss(0, 3)),
            maybe(math.exp(pick.gauss(1, 2)) - 1),  # a few below 0: log1p of max(x, 0)
            maybe(pick.gauss(5, 1)),
            maybe(pick.uniform(-5, 20)),
            maybe(pick.gauss(-3, 2)),
            maybe(pick.choice(["x", "y", "z", "w", "", "rare"]) if pick.random() < 0.95 else None),
            maybe(pick.choice(["1", "2", ""])),
            sequence(),
            float(pick.random() < 0.3),
        )
        for i in range(n)
    ]


def _transformed(feature: Numeric | Bucketized, value: float | None) -> float | None:
    """The documented transform: null stays null; clip, then log1p of max(x, 0)."""
    if value is None:
        return None
    if feature.clip is not None:
        value = min(max(value, feature.clip[0]), feature.clip[1])
    if feature.log:
        value = math.log1p(max(value, 0.0))
    return value


def _moments(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 1.0
    mean = math.fsum(values) / len(values)
    std = math.sqrt(max(math.fsum(v * v for v in values) / len(values) - mean * mean, 0.0))
    return mean, std or 1.0


def _dense(feature: Numeric, value: float | None, state: FeatureState) -> float:
    mean, std = state.moments.get(feature_name(feature), (0.0, 1.0))
    x = _transformed(feature, value)
    if x is None:
        x = feature.fill if feature.fill is not None else mean
    return (x - mean) / std if feature.standardize else x


def _vocabulary(values: list[str | None], min_frequency: int) -> list[str]:
    counts = Counter(v for v in values if v is not None)
    kept = [(-n, v) for v, n in counts.items() if n >= min_frequency]
    return [v for _, v in sorted(kept)]


def _column(rows: list[tuple[Any, ...]], name: str) -> list[Any]:
    index = [c.split()[0] for c in SCHEMA.split(", ")].index(name)
    return [r[index] for r in rows]


def _by_value(indices: list[int], keys: list[Any]) -> None:
    """A hashed index is a function of its value: equal values, equal indices."""
    seen: dict[Any, int] = {}
    for key, index in zip(keys, indices, strict=True):
        assert seen.setdefault(key, index) == index, key


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_nulls_fit_and_transform_as_documented_for_every_feature_kind(
    spark: SparkSession, seed: int
) -> None:
    rows = _rows(seed, 600)
    frame = spark.createDataFrame(rows, SCHEMA).repartition(3)
    state = fit_state(frame, SPEC)
    out = {r["id"]: r for r in training_rows(frame, SPEC, state).collect()}
    assert len(out) == len(rows)
    ids = _column(rows, "id")
    numeric = [f for f in SPEC.features if isinstance(f, Numeric)]
    sparse = [f for f in SPEC.features if not isinstance(f, Numeric | HashedSequence)]

    # The fit: moments and vocabularies over the non-null values only.
    for feature in numeric:
        if feature.fitted:
            values = [_transformed(feature, v) for v in _column(rows, feature.column)]
            expected = _moments([v for v in values if v is not None])
            assert state.moments[feature_name(feature)] == pytest.approx(expected, rel=1e-9)
    words = _vocabulary(_column(rows, "s"), 2)
    assert state.vocabularies["s"] == words

    for position, feature in enumerate(numeric):
        for row_id, value in zip(ids, _column(rows, feature.column), strict=True):
            got = out[row_id]["dense"][position]
            assert got == pytest.approx(_dense(feature, value, state), rel=1e-5, abs=1e-5)

    for position, categorical in enumerate(sparse):
        got = [out[i]["sparse"][position] for i in ids]
        _check_sparse(categorical, rows, got, state, words)

    sequences = [out[i]["seq_seq"] for i in ids]
    for given, indices in zip(_column(rows, "seq"), sequences, strict=True):
        assert len(indices) == 4
        kept = (given or [])[:4]
        for value, index in zip(kept, indices, strict=False):
            assert (index == 0) == (value is None)  # a null element: index 0
            assert 0 <= index < 32
        assert indices[len(kept) :] == [0] * (4 - len(kept))  # padding
    flat = [
        (v, i)
        for g, s in zip(_column(rows, "seq"), sequences, strict=True)
        for v, i in zip((g or [])[:4], s, strict=False)
    ]
    _by_value([i for _, i in flat], [v for v, _ in flat])


def _check_sparse(
    feature: Feature,
    rows: list[tuple[Any, ...]],
    got: list[int],
    state: FeatureState,
    words: list[str],
) -> None:
    if isinstance(feature, Bucketized):
        bounds = state.boundaries[feature_name(feature)]
        for value, index in zip(_column(rows, feature.column), got, strict=True):
            x = _transformed(feature, value)
            assert index == (0 if x is None else bisect_right(bounds, x) + 1)
    elif isinstance(feature, Vocabulary):
        for value, index in zip(_column(rows, feature.column), got, strict=True):
            expected = words.index(value) + 1 if value in words else 0  # null, rare: 0
            assert index == expected, value
    elif isinstance(feature, Hashed):
        values = _column(rows, feature.column)
        for value, index in zip(values, got, strict=True):
            assert (index == 0) if value is None else (1 <= index < feature.buckets)
        _by_value(got, values)
    elif isinstance(feature, Cross):
        pairs = list(zip(*(_column(rows, c) for c in feature.columns), strict=True))
        assert all(1 <= index < feature.buckets for index in got)  # a null is a value here
        _by_value(got, pairs)
        nulls = {i for p, i in zip(pairs, got, strict=True) if p == (None, "1")}
        empty = {i for p, i in zip(pairs, got, strict=True) if p == ("", "1")}
        assert not (nulls and empty) or nulls != empty  # null is not the empty string
