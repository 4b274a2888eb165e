"""Reading the stack's sources from Spark."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession

from flow.config import KafkaConfig

__all__ = ["read_kafka"]


def read_kafka(
    spark: SparkSession,
    kafka: KafkaConfig,
    topics: Sequence[str],
    *,
    starting_offsets: str = "earliest",
    options: dict[str, str] | None = None,
) -> DataFrame:
    """A streaming DataFrame of ``topics``: Kafka's key, value, topic, partition, offset, timestamp.

    ``starting_offsets`` applies only when the query has no checkpoint yet; afterwards the
    checkpoint decides, so a restarted query neither loses nor repeats records.
    """
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", ",".join(topics))
        .option("startingOffsets", starting_offsets)
    )
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    return reader.load()
