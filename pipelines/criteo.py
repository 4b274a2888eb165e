"""Criteo display-ads data you imported -> training rows, split by time (docs/own-data.md).

flow import criteo train.txt --table criteo.days --start 2024-01-01T00:00:00Z --rows-per-second 1
flow run pipelines/criteo.py

The `train` stage fits the features on rows before SPLIT and writes channel `train`; the
`train_holdout` stage featurizes the rows from SPLIT on with that state into channel `test`.
"""

from __future__ import annotations

from datetime import UTC, datetime

from flow.pipeline import (
    BackfillStage,
    FeatureSpec,
    Field,
    Hashed,
    IcebergSource,
    Numeric,
    Pipeline,
    run_main,
)
from flow.workflows.criteo import CATEGORICAL, INTEGER

# With --start 2024-01-01T00:00:00Z and --rows-per-second 1, the first 86,400 rows. For
# Kaggle's train.txt imported with --rows-per-second 76 (7 days): datetime(2024, 1, 7, ...).
SPLIT = datetime(2024, 1, 2, tzinfo=UTC)

CRITEO_FIELDS = (
    Field("label", "int", required=True),
    *(Field(name, "long") for name in INTEGER),
    *(Field(name, "string") for name in CATEGORICAL),
    Field("ts", "timestamp", required=True),
)


def criteo_features() -> FeatureSpec:
    return FeatureSpec(
        name="criteo",
        features=(
            # Counts: a few are -1 or -2 in the real data; clipped at 0 before log1p.
            *(Numeric(name, clip=(0, 1e9), log=True) for name in INTEGER),
            *(Hashed(name, buckets=1 << 18) for name in CATEGORICAL),
        ),
        label="label",
        passthrough=("ts",),
    )


def criteo(table: str = "criteo.days", split: datetime = SPLIT) -> Pipeline:
    whole = Pipeline(
        name="criteo",
        namespace=table.split(".")[0],
        sources={"days": IcebergSource(table, CRITEO_FIELDS, event_time="ts")},
        stages=(
            BackfillStage(name="train", events="days", features=criteo_features(), channel="train"),
        ),
    )
    # One line: stage `train` learns from the rows before `split`; stage `train_holdout` writes
    # the rows from it on to channel `test`, with the state `train` fitted in the same run.
    return whole.holdout("train", after=split, channel="test")


if __name__ == "__main__":
    run_main(criteo())
