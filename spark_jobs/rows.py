"""Where a pipeline's rows go (handoff channels, tables), and the last check before a row
becomes a training row."""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from flow.config import StackConfig
from flow.handoff import Channel
from flow.pipeline.features import FeatureSpec
from flow.pipeline.model import HandoffOutput, Pipeline
from flow.pipeline.state import FeatureState, layout
from flow.storage import namespace_locations
from spark_jobs.handoff import ExportOptions
from spark_jobs.validate import REASON

__all__ = [
    "channel_for",
    "dead_letter_table",
    "export_options",
    "split_unusable",
    "training_table",
    "unusable_inputs",
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
    spec: FeatureSpec,
    state: FeatureState,
    event_time: str | None,
    seed: int,
    labels: Mapping[str, str] | None = None,
    count_positives: bool = False,
) -> ExportOptions:
    """How a stage's training rows become shards: the pipeline's output, the spec's layout and
    how its rows were ``labels``-ed (LabelJoin.channel_labels); ``count_positives``: the writer
    tasks count the positive labels for the commit's stats."""
    output = pipeline.output
    if not isinstance(output, HandoffOutput):
        raise TypeError("the pipeline writes Iceberg tables, not the handoff")
    rows = layout(spec, state)
    sizes = {"dense": len(rows.dense), "sparse": len(rows.sparse)}
    sizes |= {f"seq_{name}": length for name, _, length in rows.sequences}
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
        max_unconsumed_bytes=output.max_unconsumed_bytes,
        labels=labels,
        label_sum="label" if count_positives else None,
    )


def unusable_reason(spec: FeatureSpec) -> Column:
    """Why a row cannot train ('' if it can): no label, or no positive weight."""
    reasons = [F.when(F.col(spec.label).isNull(), F.lit(f"label '{spec.label}' is null"))]
    if isinstance(spec.weight, str):
        weight = F.col(spec.weight)
        reasons.append(
            F.when(
                weight.isNull() | (weight <= 0),
                F.concat(
                    F.lit(f"weight '{spec.weight}' = "),
                    F.coalesce(weight.cast("string"), F.lit("null")),
                    F.lit(" is not a positive number"),
                ),
            )
        )
    return F.concat_ws("; ", *reasons)


def unusable_inputs(spec: FeatureSpec) -> set[str]:
    """The columns :func:`unusable_reason` reads."""
    return {spec.label} | ({spec.weight} if isinstance(spec.weight, str) else set())


def unusable_letters(rows: DataFrame, spec: FeatureSpec, source: str) -> DataFrame:
    """The rows that cannot train, as dead letters (the row as JSON) with the reason."""
    checked = rows.withColumn(REASON, unusable_reason(spec))
    return checked.where(F.col(REASON) != "").select(
        F.lit(source).alias("source"),
        F.lit(None).cast("string").alias("topic"),
        F.lit(None).cast("int").alias("partition"),
        F.lit(None).cast("bigint").alias("offset"),
        F.lit(None).cast("timestamp").alias("kafka_timestamp"),
        F.lit(None).cast("binary").alias("key"),
        F.to_json(F.struct(*[F.col(c) for c in rows.columns])).cast("binary").alias("raw"),
        F.col(REASON).alias("reason"),
    )


def split_unusable(rows: DataFrame, spec: FeatureSpec, source: str) -> tuple[DataFrame, DataFrame]:
    """(rows with a label and a positive weight, the others as dead letters with the reason)."""
    usable = rows.where(unusable_reason(spec) == "")
    return usable, unusable_letters(rows, spec, source)
