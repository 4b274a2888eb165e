"""MovieLens 100K as a click problem: ratings >= 4 are clicks (the label is derived by
``flow load --label``), with the users' and the movies' attributes (every genre of a movie, as a
sequence). The first 80,000 ratings in time train (channel ``ratings``), the last 20,000 evaluate
(channel ``test``). The data comes from ``prepare.py``; the commands are in docs/trainers.md."""

from __future__ import annotations

from datetime import UTC, datetime

from flow.pipeline import (
    BackfillStage,
    Bucketized,
    Derived,
    FeatureSpec,
    Field,
    Hashed,
    HashedSequence,
    History,
    IcebergSource,
    Numeric,
    Pipeline,
    Vocabulary,
    run_main,
)

FIELDS = (
    Field("user_id", "long", required=True),
    Field("movie_id", "long", required=True),
    Field("rating", "long", min=0, max=5),
    Field("ts", "timestamp", required=True),
    Field("age", "long"),
    Field("gender", "string"),
    Field("occupation", "string"),
    Field("year", "string"),
    Field("genre", "string"),
    Field("genres", "string"),
    Field("label", "int", required=True),
)


SPLIT = datetime.fromtimestamp(889237269, UTC)
"""The time of the 80,000th rating: later ones are held out."""


def pipeline() -> Pipeline:
    return Pipeline(
        name="movielens",
        namespace="movies",
        sources={"ratings": IcebergSource("movies.ratings", FIELDS, event_time="ts")},
        stages=(
            BackfillStage(
                name="backfill",
                events="ratings",
                history=(
                    History("user_ratings", key="user_id"),
                    History("user_likes", key="user_id", stat="mean", value="label"),
                    History("movie_ratings", key="movie_id"),
                    History("movie_likes", key="movie_id", stat="mean", value="label"),
                ),
                derive=(Derived("genre_list", "split(genres, '[|]')", type="array<string>"),),
                features=FeatureSpec(
                    name="ratings",
                    features=(
                        Hashed("user_id", buckets=1 << 18),
                        Hashed("movie_id", buckets=1 << 16),
                        Vocabulary("gender"),
                        Vocabulary("occupation"),
                        Vocabulary("genre"),
                        HashedSequence("genre_list", max_length=6, buckets=1 << 8),
                        Vocabulary("year"),
                        Bucketized("age", buckets=10),
                        Bucketized("user_ratings", buckets=10, log=True),
                        Bucketized("movie_ratings", buckets=10, log=True),
                        Numeric("user_likes"),
                        Numeric("movie_likes"),
                    ),
                    label="label",
                    passthrough=("ts",),
                ),
                channel="ratings",
            ),
        ),
    ).holdout("backfill", after=SPLIT, channel="test")


if __name__ == "__main__":
    run_main(pipeline())
