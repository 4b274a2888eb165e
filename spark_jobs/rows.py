"""Where a pipeline's rows go (handoff channels, tables), and the last check before a row
becomes a training row."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from flow.config import StackConfig
from flow.handoff import Channel
from flow.pipeline.features import FeatureSpec
from flow.pipeline.model import Enrich, HandoffOutput, Pipeline, Stage
from flow.pipeline.state import FeatureState, layout, raw_units
from flow.storage import namespace_locations
from flow.transform.serving import ServingFeatures
from spark_jobs.handoff import ExportOptions
from spark_jobs.joins import FOUND_PREFIX, enrichment_names, found_column
from spark_jobs.validate import REASON

__all__ = [
    "channel_for",
    "dead_letter_table",
    "export_options",
    "missing",
    "serving_features",
    "split_unusable",
    "training_table",
    "unusable_letters",
    "unusable_reason",
]


def training_table(stack: StackConfig, pipeline: Pipeline, channel: str) -> str:
    """The Iceberg table a channel's training rows go to (until the handoff replaces it)."""
    return f"{stack.catalog.name}.{pipeline.namespace}.training_{channel}"


def dead_letter_table(stack: StackConfig, pipeline: Pipeline) -> str:
    return f"{stack.catalog.name}.{pipeline.namespace}.dead_letters"


def channel_for(stack: StackConfig, pipeline: Pipeline, channel: str) -> Channel:
    """The handoff channel a stage writes: ``$FLOW_HANDOFF/<namespace>/<channel>`` by default."""
    output = pipeline.output
    root = (output.location if isinstance(output, HandoffOutput) else None) or (
        namespace_locations(stack, pipeline.namespace).handoff.uri
    )
    return Channel(root, channel)


def export_options(
    pipeline: Pipeline,
    stage: Stage,
    state: FeatureState,
    event_time: str | None,
    seed: int,
    labels: Mapping[str, str] | None = None,
    count_positives: bool = False,
    features: Mapping[str, object] | None = None,
) -> ExportOptions:
    """How a stage's training rows become shards: the pipeline's output, the spec's layout and
    how its rows were ``labels``-ed (LabelJoin.channel_labels); ``count_positives``: the writer
    tasks count the positive labels for the commit's stats; ``features``: what a new channel
    records of them for serving (:func:`serving_features`)."""
    output = pipeline.output
    if not isinstance(output, HandoffOutput):
        raise TypeError("the pipeline writes Iceberg tables, not the handoff")
    spec = stage.features
    rows = layout(spec, state)
    sizes = {"dense": len(rows.dense), "sparse": len(rows.sparse)}
    sizes |= {f"seq_{name}": length for name, _, length in rows.sequences}
    sizes["ids"] = len(rows.ids)
    return ExportOptions(
        num_buckets=output.num_buckets,
        compression=output.compression,
        compression_level=output.compression_level,
        shuffle_key=output.shuffle_key,
        seed=seed,
        max_rows_per_shard=output.max_rows_per_shard,
        event_time=event_time if event_time in spec.passthrough else None,
        fixed_sizes={k: v for k, v in sizes.items() if v > 0},
        layout=rows.to_dict(),
        feature_state=state.version,
        units=raw_units(spec, state),
        max_unconsumed_bytes=output.max_unconsumed_bytes,
        labels=labels,
        label_sum="label" if count_positives else None,
        features=features,
    )


def serving_features(
    pipeline: Pipeline, stage: Stage, state: FeatureState, example: pa.Table | None = None
) -> dict[str, object]:
    """``stage``'s features as a served model applies them (flow.transform.ServingFeatures, as
    plain data), with up to two of ``example``'s rows as raw examples."""
    return ServingFeatures.for_stage(pipeline, stage.name, state, example).to_dict()


def _shown(column: Column) -> Column:
    return F.coalesce(column.cast("string"), F.lit("null"))


def _label_reason(spec: FeatureSpec) -> Column:
    """Why the label cannot train: missing, not a number, or not what ``spec.labels`` allows."""
    raw = F.col(spec.label)
    value = raw.cast("double")
    allowed = (
        value.isin(0.0, 1.0)
        if spec.labels == "binary"
        else (value >= 0) & (value <= 1) & ~F.isnan(value)
    )
    said = "0 or 1" if spec.labels == "binary" else "in [0, 1]"
    return F.when(raw.isNull(), F.lit(f"label '{spec.label}' is null")).when(
        ~F.coalesce(allowed, F.lit(False)),
        F.concat(
            F.lit(f"label '{spec.label}' = "),
            _shown(raw),
            F.lit(
                f" is not {said} (FeatureSpec.labels={spec.labels!r}; derive a label that "
                "is, e.g. Derived('label', 'rating >= 4'))"
            ),
        ),
    )


def _weight_reason(spec: FeatureSpec, weight_column: str) -> Column:
    """Why the weight cannot train: missing, not a positive number, or outside its range."""
    raw = F.col(weight_column)
    value = raw.cast("double")
    bad = value.isNull() | F.isnan(value) | (value <= 0)
    said = "a positive number"
    if spec.weight_range is not None:
        low, high = spec.weight_range
        bad = bad | (value < low) | (value > high)
        said = f"in [{low:g}, {high:g}] (FeatureSpec.weight_range)"
    return F.when(
        bad, F.concat(F.lit(f"weight '{weight_column}' = "), _shown(raw), F.lit(f" is not {said}"))
    )


def _missing_reason(spec: Enrich) -> Column:
    return F.when(
        F.col(found_column(spec)).isNull(),
        F.concat(F.lit(f"no {spec.source} row with {spec.on} = "), _shown(F.col(spec.on))),
    )


def missing(enrichments: Sequence[Enrich]) -> dict[str, Column]:
    """Per enrichment, by :func:`~spark_jobs.joins.enrichment_names`: whether a row's key was
    not in its table."""
    names = enrichment_names(enrichments)
    return {n: F.col(found_column(e)).isNull() for n, e in zip(names, enrichments, strict=True)}


def unusable_reason(spec: FeatureSpec, enrichments: Sequence[Enrich] = ()) -> Column:
    """Why a row cannot train ('' if it can): its label (null, or not what the spec's
    ``labels`` allows), its weight (not positive, or outside ``weight_range``), or a key an
    enrichment with ``on_missing="dead_letter"`` did not find."""
    reasons = [_label_reason(spec)]
    if isinstance(spec.weight, str):
        reasons.append(_weight_reason(spec, spec.weight))
    reasons += [_missing_reason(e) for e in enrichments if e.on_missing == "dead_letter"]
    return F.concat_ws("; ", *reasons)


def unusable_letters(
    rows: DataFrame, spec: FeatureSpec, source: str, enrichments: Sequence[Enrich] = ()
) -> DataFrame:
    """The rows that cannot train, as dead letters (the row as JSON) with the reason."""
    checked = rows.withColumn(REASON, unusable_reason(spec, enrichments))
    shown = [F.col(c) for c in rows.columns if not c.startswith(FOUND_PREFIX)]
    return checked.where(F.col(REASON) != "").select(
        F.lit(source).alias("source"),
        F.lit(None).cast("string").alias("topic"),
        F.lit(None).cast("int").alias("partition"),
        F.lit(None).cast("bigint").alias("offset"),
        F.lit(None).cast("timestamp").alias("kafka_timestamp"),
        F.lit(None).cast("binary").alias("key"),
        F.to_json(F.struct(*shown)).cast("binary").alias("raw"),
        F.col(REASON).alias("reason"),
    )


def split_unusable(
    rows: DataFrame, spec: FeatureSpec, source: str, enrichments: Sequence[Enrich] = ()
) -> tuple[DataFrame, DataFrame]:
    """(rows that can train, the others as dead letters with the reason)."""
    usable = rows.where(unusable_reason(spec, enrichments) == "")
    return usable, unusable_letters(rows, spec, source, enrichments)
