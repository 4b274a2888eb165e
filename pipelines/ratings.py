"""Ratings you loaded yourself -> training rows (docs/own-data.md).

flow load ratings.csv --table movies.ratings ...    # see the guide for the flags
flow run pipelines/ratings.py
"""

from __future__ import annotations

from flow.pipeline import (
    BackfillStage,
    FeatureSpec,
    Field,
    Hashed,
    IcebergSource,
    Pipeline,
    run_main,
)

# The columns `flow load` wrote, with the Field types its schema table showed.
RATING_FIELDS = (
    Field("user_id", "long", required=True),
    Field("movie_id", "long", required=True),
    Field("rating", "double", min=0, max=5),
    Field("ts", "timestamp", required=True),
    Field("label", "int", required=True),
)


def ratings(table: str = "movies.ratings") -> Pipeline:
    return Pipeline(
        name="ratings",
        namespace=table.split(".")[0],
        sources={"ratings": IcebergSource(table, RATING_FIELDS, event_time="ts")},
        stages=(
            BackfillStage(
                name="backfill",
                events="ratings",
                # `label` (1 for 4 stars or more) came from `flow load --label 'rating>=4'`;
                # the rating itself is no feature, it would give the label away.
                features=FeatureSpec(
                    name="ratings",
                    features=(
                        Hashed("user_id", buckets=1 << 18),
                        Hashed("movie_id", buckets=1 << 16),
                    ),
                    label="label",
                    passthrough=("ts",),
                ),
                channel="ratings",
            ),
        ),
    )


if __name__ == "__main__":
    run_main(ratings())
