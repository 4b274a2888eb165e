"""The fitted state does not depend on how Spark partitioned the rows, and is exact."""

from __future__ import annotations

import math
import random
from bisect import bisect_right

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from flow.pipeline import Bucketized, FeatureSpec, Numeric
from spark_jobs.features import fit_state

pytestmark = pytest.mark.integration

SPEC = FeatureSpec(
    name="fit",
    features=(
        Numeric("x", clip=(-5, 5)),
        Numeric("y", log=True),
        Bucketized("y", buckets=8, log=True, name="y_bucket"),
        Bucketized("z", buckets=4, name="z_bucket"),
    ),
    label="label",
)
SCHEMA = "x double, y double, z double, label double"


def _rows(seed: int, n: int) -> list[tuple[float | None, float | None, float | None, float]]:
    pick = random.Random(seed)

    def maybe(value: float) -> float | None:
        return None if pick.random() < 0.1 else value

    return [
        (
            maybe(pick.gauss(0, 3)),
            maybe(math.exp(pick.gauss(2, 1.5))),
            maybe(float(pick.choice([1, 2, 2, 3, 3, 3, 7]))),  # ties: few distinct values
            float(pick.random() < 0.2),
        )
        for _ in range(n)
    ]


def _exact_boundaries(values: list[float], buckets: int) -> list[float]:
    """The documented quantiles: for i in 1 .. buckets - 1 the smallest value v with at least
    i / buckets of the values at or below it; duplicates dropped."""
    ordered = sorted(values)
    n = len(ordered)
    found = set()
    for i in range(1, buckets):
        # the smallest v with count(<= v) * buckets >= i * n
        k = next(k for k in range(n) if (k + 1) * buckets >= i * n)
        found.add(ordered[k])
    return sorted(found)


@pytest.mark.parametrize("seed", [1, 2])
def test_the_state_is_the_same_on_any_partitioning_and_matches_the_exact_one(
    spark: SparkSession, seed: int
) -> None:
    rows = _rows(seed, 3000)
    frame = spark.createDataFrame(rows, SCHEMA)
    states = [
        fit_state(frame.repartition(partitions, F.rand(seed + partitions)), SPEC)
        for partitions in (1, 3, 7)
    ]
    for other in states[1:]:
        assert other.moments == states[0].moments
        assert other.boundaries == states[0].boundaries

    state = states[0]
    ys = [math.log1p(max(y, 0.0)) for _, y, _, _ in rows if y is not None]
    zs = [z for _, _, z, _ in rows if z is not None]
    assert state.boundaries["y_bucket"] == _exact_boundaries(ys, 8)
    assert state.boundaries["z_bucket"] == _exact_boundaries(zs, 4)
    xs = [min(max(x, -5.0), 5.0) for x, _, _, _ in rows if x is not None]
    mean = math.fsum(xs) / len(xs)
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / len(xs))
    assert state.moments["x"] == pytest.approx((mean, std), rel=1e-9)
    # Every bucket but those of tied values holds about its share of the rows.
    edges = state.boundaries["y_bucket"]
    counts = [0] * (len(edges) + 1)
    for y in ys:
        counts[bisect_right(edges, y)] += 1
    assert max(counts) <= len(ys) / 8 + 2


def test_a_column_of_nulls_fits_neutral_moments_and_no_boundaries(spark: SparkSession) -> None:
    frame = spark.createDataFrame([(None, None, None, 0.0)] * 5, SCHEMA)
    state = fit_state(frame, SPEC)
    assert state.moments["x"] == (0.0, 1.0)
    assert state.boundaries["y_bucket"] == []
