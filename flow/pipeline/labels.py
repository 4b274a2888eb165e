"""A stage's labels checked on a sample of its events, before the job that reads them all.

A label column that is not 0/1 (stars of 1-5, a count of clicks) makes nearly every row a dead
letter; the stage's dead-letter bound (``BackfillStage.max_dead_share``) stops it, but only
after a job over every event. The first rows of the table tell the same in seconds: if more of
their labels than the bound cannot train, the stage fails before it reads the rest or writes.
Null labels are left to the full count: they may be few overall though many in the first rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from flow.pipeline.features import LabelKind

__all__ = ["SAMPLE_ROWS", "LabelSample", "label_sample"]

SAMPLE_ROWS = 1_000
"""Rows of the events read for the check: one small read of the table's first file."""


@dataclass(frozen=True)
class LabelSample:
    """What a sample of a label column holds: ``bad`` of ``rows`` non-null labels cannot train,
    the first of them ``example``."""

    rows: int
    bad: int
    example: object = None

    @property
    def share(self) -> float:
        return self.bad / self.rows if self.rows else 0.0


def _trains(value: object, labels: LabelKind) -> bool:
    """Whether a non-null label can train, as Spark's cast to double reads it."""
    if isinstance(value, bool | int | float | Decimal):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return False
    else:
        return False
    if labels == "binary":
        return number in (0.0, 1.0)
    return not math.isnan(number) and 0.0 <= number <= 1.0


def label_sample(values: Sequence[object], labels: LabelKind) -> LabelSample:
    """The non-null ``values`` that a FeatureSpec with ``labels`` cannot train on."""
    present = [v for v in values if v is not None]
    bad = [v for v in present if not _trains(v, labels)]
    return LabelSample(len(present), len(bad), bad[0] if bad else None)
