"""A sample of a label column: the labels a stage cannot train on are counted as Spark's
dead-letter check would count them, nulls left to the full count."""

from __future__ import annotations

from decimal import Decimal

from flow.pipeline.labels import label_sample


def test_stars_of_1_to_5_are_mostly_labels_that_cannot_train() -> None:
    sample = label_sample([1, 2, 3, 4, 5] * 20, "binary")
    assert (sample.rows, sample.bad, sample.example) == (100, 80, 2)
    assert sample.share == 0.8


def test_0_1_labels_in_any_type_train_and_nulls_are_not_counted() -> None:
    values = [0, 1, 0.0, 1.0, "1", " 0 ", True, Decimal("1"), None, None]
    sample = label_sample(values, "binary")
    assert (sample.rows, sample.bad, sample.share) == (8, 0, 0.0)
    assert label_sample([None, None], "binary").share == 0.0


def test_soft_labels_train_in_0_to_1_only() -> None:
    sample = label_sample([0.25, 0.5, 1.0, 1.5, float("nan"), "yes", -0.1], "probability")
    assert (sample.rows, sample.bad, sample.example) == (7, 4, 1.5)
    assert label_sample([0.25], "binary").bad == 1
