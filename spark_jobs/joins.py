"""Joins of a stage: the label join (batch and stream) and dimension enrichment."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from flow.pipeline.model import Enrich, LabelJoin

__all__ = ["deduplicated", "enrich", "is_label_dedup", "label_batch", "label_stream"]

_KEY = "_label_key"
_TIME = "_label_ts"


def _window_condition(label: LabelJoin, event_time: str) -> Column:
    start = F.col(event_time)
    return (F.col(_TIME) >= start) & (F.col(_TIME) <= start + F.expr(f"INTERVAL {label.window}"))


def label_batch(
    events: DataFrame, labels: DataFrame, label: LabelJoin, event_time: str, label_event_time: str
) -> DataFrame:
    """Label every event: 1 with a matching label event within the window, else 0.

    Each event appears exactly once: several matches count as one, with the earliest time.
    """
    matches = labels.select(F.col(label.key).alias(_KEY), F.col(label_event_time).alias(_TIME))
    first = (
        events.select(F.col(label.key).alias(_KEY), F.col(event_time).alias("_event_ts"))
        .join(matches, _KEY)
        .where(_window_condition(label, "_event_ts"))
        .groupBy(_KEY, "_event_ts")
        .agg(F.min(_TIME).alias(label.label_time))
    )
    joined = events.join(
        first,
        (events[label.key] == first[_KEY]) & (events[event_time] == first["_event_ts"]),
        "left",
    )
    return joined.select(
        *[events[c] for c in events.columns],
        F.col(label.label_time).isNotNull().cast("double").alias(label.label),
        F.col(label.label_time),
    )


def label_stream(
    events: DataFrame,
    labels: DataFrame,
    label: LabelJoin,
    event_time: str,
    event_watermark: str,
    label_event_time: str,
    label_watermark: str,
    *,
    event_key: str | None = None,
) -> DataFrame:
    """The streaming label join: a left outer stream-stream join bounded by watermarks.

    A positive is emitted when its label event arrives; a negative once the watermark passes the
    end of its window. Duplicate label events for one key are dropped within the watermark, so
    an event is never emitted twice; with ``event_key``, repeated events are dropped too.
    """
    matches = (
        labels.select(F.col(label.key).alias(_KEY), F.col(label_event_time).alias(_TIME))
        .withWatermark(_TIME, label_watermark)
        .dropDuplicatesWithinWatermark([_KEY])
    )
    watermarked = deduplicated(events, event_time, event_watermark, event_key)
    joined = watermarked.join(
        matches,
        (F.col(label.key) == F.col(_KEY)) & _window_condition(label, event_time),
        "leftOuter",
    )
    return joined.select(
        *[F.col(c) for c in events.columns],
        F.col(_KEY).isNotNull().cast("double").alias(label.label),
        F.col(_TIME).alias(label.label_time),
    )


def deduplicated(events: DataFrame, event_time: str, watermark: str, key: str | None) -> DataFrame:
    """``events`` watermarked, and without repeats of ``key`` within the watermark (if given)."""
    watermarked = events.withWatermark(event_time, watermark)
    return watermarked.dropDuplicatesWithinWatermark([key]) if key else watermarked


def is_label_dedup(key_names: str) -> bool:
    """Whether a deduplication operator's keys are the label side's (for counting its drops)."""
    return _KEY in key_names


def enrich(events: DataFrame, dimension: DataFrame, spec: Enrich) -> DataFrame:
    """Add the dimension's columns (prefixed) to each event; unmatched events keep nulls.

    One row per key is kept from the dimension, so a duplicated key there can never duplicate
    events here.
    """
    dim = dimension.dropDuplicates([spec.on]).select(
        F.col(spec.on).alias("_enrich_key"),
        *[F.col(c).alias(spec.prefix + c) for c in spec.columns],
    )
    # No broadcast hint: a users table may hold 100M rows; the planner (AQE) broadcasts the
    # small ones by size.
    joined = events.join(dim, events[spec.on] == dim["_enrich_key"], "left")
    return joined.drop("_enrich_key")
