"""The CTR example's shared definitions: the sources' columns, enrichment and feature spec.

``ctr_backfill.py`` (Iceberg history) and ``ctr_streaming.py`` (Kafka) compose these, so both
produce the same training-row layout from one fitted feature state.
"""

from __future__ import annotations

from typing import Literal

from flow.pipeline import (
    Bucketized,
    Cross,
    Enrich,
    FeatureSpec,
    Field,
    Hashed,
    HashedSequence,
    IcebergSource,
    LabelJoin,
    Numeric,
    Vocabulary,
)

NAMESPACE = "ctr"

IMPRESSION_FIELDS = (
    Field("impression_id", "string", required=True),
    Field("user_id", "long", required=True, min=0),
    Field("item_id", "long", required=True, min=0),
    Field("ts", "timestamp", required=True),
    Field("position", "int", min=1, max=50),
    Field("device", "string", allowed=("ios", "android", "web")),
    # The probability the synthetic generator drew the click from; real data has none (null).
    Field("p_click", "double", min=0, max=1),
)
CLICK_FIELDS = (
    Field("impression_id", "string", required=True),
    Field("ts", "timestamp", required=True),
)
USER_COLUMNS = (
    Field("user_id", "long", required=True),
    Field("country", "string"),
    Field("age", "int", min=0, max=130),
    Field("favorite_category", "string"),
    Field("recent_items", "array<long>"),
)
ITEM_COLUMNS = (
    Field("item_id", "long", required=True),
    Field("category", "string"),
    Field("brand", "string"),
    Field("price", "double", min=0),
    Field("rating", "double", min=0, max=5),
)


def dimensions(namespace: str = NAMESPACE) -> dict[str, IcebergSource]:
    return {
        "users": IcebergSource(f"{namespace}.users", USER_COLUMNS),
        "items": IcebergSource(f"{namespace}.items", ITEM_COLUMNS),
    }


def enrichment() -> tuple[Enrich, ...]:
    return (
        Enrich(
            "users",
            on="user_id",
            columns=("country", "age", "favorite_category", "recent_items"),
            prefix="user_",
        ),
        Enrich(
            "items", on="item_id", columns=("category", "brand", "price", "rating"), prefix="item_"
        ),
    )


def label_join(strategy: Literal["window", "immediate"] = "window") -> LabelJoin:
    """A click within 30 minutes of its impression makes a positive; a live stage emits each
    impression when its label is final (``window``) or at once (``immediate``, see LabelJoin)."""
    return LabelJoin("clicks", key="impression_id", window="30 minutes", strategy=strategy)


def ctr_features() -> FeatureSpec:
    return FeatureSpec(
        name="ctr",
        features=(
            Hashed("user_id", buckets=1 << 18),
            Hashed("item_id", buckets=1 << 16),
            Vocabulary("user_country", min_frequency=5),
            Vocabulary("user_favorite_category"),
            Vocabulary("item_category"),
            Vocabulary("item_brand", min_frequency=10),
            Vocabulary("device"),
            Cross(
                ("user_favorite_category", "item_category"), buckets=1024, name="taste_x_category"
            ),
            Bucketized("item_price", buckets=16, log=True, name="price_bucket"),
            Numeric("user_age", clip=(16, 90)),
            Numeric("item_price", log=True),
            Numeric("item_rating"),
            Numeric("position", clip=(1, 50), log=True),
            HashedSequence("user_recent_items", max_length=10, buckets=1 << 16),
        ),
        label="label",
        # p_click rides along for the trainer's oracle AUC (no feature reads it); produced_at
        # for the trainer's freshness from production to training.
        passthrough=("ts", "label_time", "impression_id", "p_click", "produced_at"),
    )
