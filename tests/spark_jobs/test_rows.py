"""The last check before a row trains: its label and its weight, with the reason when not."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from flow.pipeline import FeatureSpec, Hashed
from spark_jobs.rows import split_unusable

pytestmark = pytest.mark.integration

ROWS = [
    ("a", 0.0, 1.0),
    ("b", 1.0, 2.5),
    ("c", 4.0, 1.0),  # a rating, not a click
    ("d", None, 1.0),
    ("e", float("nan"), 1.0),
    ("f", 0.5, 1.0),  # a soft label
    ("g", 1.0, 0.0),
    ("h", 0.0, None),
    ("i", 1.0, 500.0),
]


def spec(**changes: object) -> FeatureSpec:
    base: dict[str, object] = {
        "name": "rows",
        "features": (Hashed("id", buckets=8),),
        "label": "rating",
        "weight": "w",
    }
    return FeatureSpec(**(base | changes))  # type: ignore[arg-type]


def checked(spark: SparkSession, features: FeatureSpec) -> tuple[set[str], dict[str, str]]:
    """(ids that train, reason of each id that does not)."""
    df = spark.createDataFrame(ROWS, "id string, rating double, w double")
    usable, letters = split_unusable(df, features, "events")
    reasons = {}
    for letter in letters.collect():
        row_id = letter["raw"].decode().split('"id":"')[1][0]
        reasons[row_id] = letter["reason"]
    return {r["id"] for r in usable.collect()}, reasons


def test_labels_must_be_clicks_and_weights_positive(spark: SparkSession) -> None:
    trains, reasons = checked(spark, spec())
    assert trains == {"a", "b", "i"}
    assert reasons["c"].startswith("label 'rating' = 4.0 is not 0 or 1 (FeatureSpec.labels=")
    assert "Derived('label', 'rating >= 4')" in reasons["c"]
    assert reasons["d"] == "label 'rating' is null"
    assert reasons["e"].startswith("label 'rating' = NaN is not 0 or 1")
    assert reasons["f"].startswith("label 'rating' = 0.5 is not 0 or 1")
    assert reasons["g"] == "weight 'w' = 0.0 is not a positive number"
    assert reasons["h"] == "weight 'w' = null is not a positive number"
    assert set(reasons) | trains == {r[0] for r in ROWS}  # nothing lost


def test_soft_labels_and_a_weight_range_when_declared(spark: SparkSession) -> None:
    trains, reasons = checked(spark, spec(labels="probability", weight_range=(0.5, 100)))
    assert trains == {"a", "b", "f"}
    assert reasons["c"].startswith("label 'rating' = 4.0 is not in [0, 1]")
    assert reasons["i"] == "weight 'w' = 500.0 is not in [0.5, 100] (FeatureSpec.weight_range)"
    assert reasons["g"].startswith("weight 'w' = 0.0 is not in [0.5, 100]")
