"""Joins of a stage: the label join (batch and stream) and dimension enrichment."""

from __future__ import annotations

import re
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from flow.pipeline.model import Enrich, LabelJoin
from flow.pipeline.schema import interval_seconds
from flow.pipeline.sources import PRODUCED_AT
from spark_jobs.jvm import project_operator

__all__ = [
    "FOUND_PREFIX",
    "POSITIVES",
    "UNMATCHED",
    "dedup_kind",
    "deduplicated",
    "dimension_side",
    "enrich",
    "enrichment_names",
    "found_column",
    "label_batch",
    "label_stream",
    "label_stream_immediate",
]

_KEY = "_label_key"
_TIME = "_label_ts"
_PRODUCED = "_label_produced_at"
_AGAIN = "_label_again_key"
UNMATCHED = "_label_unmatched"
"""A streamed label join's column: true on a row that is a label event which labelled nothing
(no event of its key within its window), emitted once the watermark has passed it. Such a row
carries no event (its columns are null): writers count it and write nothing of it."""


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


def _matches(
    labels: DataFrame, label: LabelJoin, label_event_time: str, watermark: str
) -> DataFrame:
    """The label events as (key, time, when produced), watermarked, the first per key kept."""
    produced = (
        F.col(PRODUCED_AT) if PRODUCED_AT in labels.columns else F.lit(None).cast("timestamp")
    )
    return (
        labels.select(
            F.col(label.key).alias(_KEY),
            F.col(label_event_time).alias(_TIME),
            produced.alias(_PRODUCED),
        )
        .withWatermark(_TIME, watermark)
        .dropDuplicatesWithinWatermark([_KEY])
    )


def _event_columns(events: DataFrame) -> list[Column]:
    """The events' columns; a row a label event completed was produced when that was."""
    return [
        F.greatest(F.col(c), F.col(_PRODUCED)).alias(c) if c == PRODUCED_AT else F.col(c)
        for c in events.columns
    ]


def _unmatched(event_time: str) -> Column:
    """Whether an outer join's row is a label event alone: it has a label time (a label event
    without one is never evicted, so never emitted alone) and no event time (a matched row has
    both: the window condition needs them). No column of the join's state is added for it: a
    checkpoint made before keeps its state's schema."""
    return (F.col(_TIME).isNotNull() & F.col(event_time).isNull()).alias(UNMATCHED)


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
    """The ``window`` strategy: a full outer stream-stream join bounded by watermarks.

    A positive is emitted when its label event arrives; a negative once the watermark passes the
    end of its window. Duplicate label events for one key are dropped within the watermark, so
    an event is never emitted twice; with ``event_key``, repeated events are dropped too. A label
    event that labelled nothing comes out alone (:data:`UNMATCHED`) once the watermark passes
    it: so it is counted, where a left outer join let it vanish from the state.
    """
    matches = _matches(labels, label, label_event_time, label_watermark)
    watermarked = deduplicated(events, event_time, event_watermark, event_key)
    joined = watermarked.join(
        matches,
        (F.col(label.key) == F.col(_KEY)) & _window_condition(label, event_time),
        "fullOuter",
    )
    return joined.select(
        *_event_columns(events),
        F.col(_KEY).isNotNull().cast("double").alias(label.label),
        F.col(_TIME).alias(label.label_time),
        _unmatched(event_time),
    )


def label_stream_immediate(
    events: DataFrame,
    labels: DataFrame,
    label: LabelJoin,
    event_time: str,
    event_watermark: str,
    label_event_time: str,
    label_watermark: str,
    *,
    event_key: str | None = None,
    positives: str = "processor",
) -> DataFrame:
    """The ``immediate`` strategy: every event at once as a negative, and again as a positive
    when its label event arrives within the window (what a right outer stream-stream join
    emits: a label event that labelled nothing comes out alone, :data:`UNMATCHED`, once the
    watermark passes it; by default from the project's processor, see :data:`POSITIVES`).

    The events are read twice, once per branch; each branch drops repeated events within the
    watermark by itself. The positive branch deduplicates on a key of its own name
    (:func:`dedup_kind` tells its drops apart), so repeats and late events are counted once, by
    the negative branch, which sees every event. ``positives``: one of :data:`POSITIVES`.
    """
    negatives = deduplicated(events, event_time, event_watermark, event_key).select(
        *[F.col(c) for c in events.columns],
        F.lit(0.0).alias(label.label),
        F.lit(None).cast("timestamp").alias(label.label_time),
        F.lit(False).alias(UNMATCHED),
    )
    again = events.withColumn(_AGAIN, F.col(event_key or label.key))
    candidates = deduplicated(again, event_time, event_watermark, _AGAIN)
    matches = _matches(labels, label, label_event_time, label_watermark)
    if positives == "processor":
        found = _processed_positives(candidates.select(*events.columns), matches, label, event_time)
        return negatives.unionByName(found)
    joined = candidates.join(
        matches,
        (F.col(label.key) == F.col(_KEY)) & _window_condition(label, event_time),
        "rightOuter",
    )
    found = joined.select(
        *_event_columns(events),
        F.lit(1.0).alias(label.label),
        F.col(_TIME).alias(label.label_time),
        _unmatched(event_time),
    )
    return negatives.unionByName(found)


POSITIVES = ("processor", "join")
"""How the immediate strategy pairs events with their label events: ``processor``, Primus
Flow's own transformWithState operator (flow.spark.ImmediatePositives: event-time timers, so a
batch costs what it reads and what expires), or ``join``, Spark's right outer stream-stream join,
which scans all of its state every batch to find what to evict (SPARK-55144); it stays for the
checkpoints made with it and for the memory state store, which transformWithState does not run
on. Both emit the same rows."""

_SIDE = "_label_side"
_GROUP = "_label_group"
_NULL_KEY = "\u0000"
"""The processor's group for label events without a key: they label nothing and come out alone
(UNMATCHED) once the watermark passes them, as from the join."""


def _processed_positives(
    candidates: DataFrame, matches: DataFrame, label: LabelJoin, event_time: str
) -> DataFrame:
    """The join's rows, from the processor: the events (without a key they match nothing) and
    the label events in one frame, grouped by the key as a string."""
    columns = candidates.columns
    events = candidates.where(F.col(label.key).isNotNull()).select(
        *columns, F.col(label.key).cast("string").alias(_GROUP), F.lit(True).alias(_SIDE)
    )
    labelled = matches.select(
        F.coalesce(F.col(_KEY).cast("string"), F.lit(_NULL_KEY)).alias(_GROUP),
        F.lit(False).alias(_SIDE),
        _TIME,
        _PRODUCED,
    )
    both = events.unionByName(labelled, allowMissingColumns=True)
    window = interval_seconds(label.window, "LabelJoin.window") * 1_000_000
    return project_operator(
        both,
        "ImmediatePositives",
        _GROUP,
        columns,
        _SIDE,
        event_time,
        PRODUCED_AT if PRODUCED_AT in columns else None,
        _TIME,
        _PRODUCED,
        window,
        label.label,
        label.label_time,
        UNMATCHED,
    )


def deduplicated(events: DataFrame, event_time: str, watermark: str, key: str | None) -> DataFrame:
    """``events`` watermarked, and without repeats of ``key`` within the watermark (if given)."""
    watermarked = events.withWatermark(event_time, watermark)
    return watermarked.dropDuplicatesWithinWatermark([key]) if key else watermarked


def dedup_kind(key_names: str) -> str:
    """Whose repeats a deduplication operator drops, by its keys' text: ``labels``, ``events``,
    or ``again`` (the immediate strategy's positive branch: every event it sees, the negative
    branch saw and counted too)."""
    if _AGAIN in key_names:
        return "again"
    return "labels" if _KEY in key_names else "events"


def enrichment_names(enrichments: Sequence[Enrich]) -> list[str]:
    """Each enrichment's name in the counts: its source, with its prefix in front where a stage
    enriches from one table twice (say buyer_ and seller_ users)."""
    sources = [e.source for e in enrichments]
    return [e.prefix + e.source if sources.count(e.source) > 1 else e.source for e in enrichments]


def found_column(spec: Enrich) -> str:
    """The column :func:`enrich` adds: true where the event's key was in the table, null where
    it was not (the miss counts and ``on_missing="dead_letter"`` read it)."""
    return f"{FOUND_PREFIX}{re.sub(r'[^0-9A-Za-z_]', '_', spec.prefix + spec.source)}"


FOUND_PREFIX = "_found_"
"""Columns an enrichment adds for the stage's own checks, never a training row's."""


def dimension_side(dimension: DataFrame, spec: Enrich) -> DataFrame:
    """The dimension as :func:`enrich` joins it: one row per key (a duplicated key there can
    never duplicate events), the key renamed, the columns prefixed, and :func:`found_column`.
    A stream keeps it cached while the table's snapshot stays the same (spark_jobs.dimensions)."""
    return dimension.dropDuplicates([spec.on]).select(
        F.col(spec.on).alias("_enrich_key"),
        *[F.col(c).alias(spec.prefix + c) for c in spec.columns],
        F.lit(True).alias(found_column(spec)),
    )


def enrich(events: DataFrame, side: DataFrame, spec: Enrich) -> DataFrame:
    """Add the dimension's columns (prefixed) to each event; unmatched events keep nulls, and
    null in :func:`found_column`.

    ``side`` is the dimension prepared by :func:`dimension_side`.
    """
    # No broadcast hint: a users table may hold 100M rows; the planner (AQE) broadcasts the
    # small ones by size.
    joined = events.join(side, events[spec.on] == side["_enrich_key"], "left")
    return joined.drop("_enrich_key")
