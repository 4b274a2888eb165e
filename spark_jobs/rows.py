"""Table names of a pipeline, and the last check before a row becomes a training row."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from flow.config import StackConfig
from flow.pipeline.features import FeatureSpec
from flow.pipeline.model import Pipeline
from spark_jobs.validate import REASON

__all__ = ["dead_letter_table", "split_unusable", "training_table"]


def training_table(stack: StackConfig, pipeline: Pipeline, channel: str) -> str:
    """The Iceberg table a channel's training rows go to (until the handoff replaces it)."""
    return f"{stack.catalog.name}.{pipeline.namespace}.training_{channel}"


def dead_letter_table(stack: StackConfig, pipeline: Pipeline) -> str:
    return f"{stack.catalog.name}.{pipeline.namespace}.dead_letters"


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
