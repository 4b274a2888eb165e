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
) -> ExportOptions:
    """How a stage's training rows become shards: the pipeline's output, the spec's layout and
    how its rows were ``labels``-ed (LabelJoin.channel_labels)."""
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
    )


def _unusable(spec: FeatureSpec) -> Column:
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


def split_unusable(rows: DataFrame, spec: FeatureSpec, source: str) -> tuple[DataFrame, DataFrame]:
    """(rows with a label and a positive weight, the others as dead letters with the reason)."""
    checked = rows.withColumn(REASON, _unusable(spec))
    usable = checked.where(F.col(REASON) == "").drop(REASON)
    dead = checked.where(F.col(REASON) != "").select(
        F.lit(source).alias("source"),
        F.lit(None).cast("string").alias("topic"),
        F.lit(None).cast("int").alias("partition"),
        F.lit(None).cast("bigint").alias("offset"),
        F.lit(None).cast("timestamp").alias("kafka_timestamp"),
        F.lit(None).cast("binary").alias("key"),
        F.to_json(F.struct(*[F.col(c) for c in rows.columns])).cast("binary").alias("raw"),
        F.col(REASON).alias("reason"),
    )
    return usable, dead
