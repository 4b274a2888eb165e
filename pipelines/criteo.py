"""Criteo display-ads data you imported -> training rows, split by time (docs/own-data.md).

flow import criteo train.txt --table criteo.days --start 2024-01-01T00:00:00Z --rows-per-second 1
flow run pipelines/criteo.py

The import records where training ends on the table (--split-at, by default the first 80% of
the rows); the `train` stage fits the features on the rows before it and writes channel
`train`, the `train_holdout` stage featurizes the rest with that state into channel `test`.
"""

from __future__ import annotations

from datetime import datetime

from flow.config import StackConfig
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
from flow.workflows.criteo import CATEGORICAL, INTEGER, recorded_split

TABLE = "criteo.days"

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


def criteo(table: str, split: datetime) -> Pipeline:
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
    # The split is the one `flow import criteo` recorded on the table (its --split-at).
    run_main(criteo(TABLE, recorded_split(StackConfig.from_env(), TABLE)))
