"""How many shuffle partitions a stage's jobs get, when the user did not say.

Spark's default is 200 whatever the cluster: on the local standalone cluster of two 1-core
workers the CTR backfill of 50,000 rows ran 1,462 tasks (7 stages of 200) in 437 s, and 174 s
with 2 (issue 49). A stateful live stage pays more: a state store per partition and operator is
committed every micro-batch. So a stage sizes its shuffles by the cluster's cores, and a batch
stage also by its input, so that a large backfill does not get partitions of many gigabytes.

A user's ``--conf spark.sql.shuffle.partitions=N`` (or the stage's own ``partitions``) wins; the
local session's launch conf already sets one per core (``spark_jobs.conf``), so this changes what
cluster runs get.
"""

from __future__ import annotations

import math

from pyspark.sql import SparkSession

from spark_jobs.jvm import default_parallelism, launch_conf

__all__ = ["TARGET_PARTITION_BYTES", "partitions_for", "shuffle_partitions"]

TARGET_PARTITION_BYTES = 128 << 20
"""Input bytes per shuffle partition of a batch stage (Spark's own file split size)."""

MAX_PARTITIONS = 4096
"""Above this, AQE's coalescing has too many small shuffle files to merge."""


def partitions_for(cores: int, input_bytes: int | None) -> int:
    """At least one partition per core (never fewer than 2), more when the input is larger
    than ``cores`` partitions of :data:`TARGET_PARTITION_BYTES`."""
    floor = max(2, cores)
    if input_bytes is None:
        return floor
    return max(floor, min(MAX_PARTITIONS, math.ceil(input_bytes / TARGET_PARTITION_BYTES)))


def shuffle_partitions(
    spark: SparkSession, given: int | None = None, input_bytes: int | None = None
) -> int | None:
    """The partitions to set for a stage's shuffles, or None to keep the session's: ``given``
    (the stage's setting) wins, then a ``spark.sql.shuffle.partitions`` the driver was launched
    with, else :func:`partitions_for` the cluster's cores and ``input_bytes``."""
    if given is not None:
        return given
    if launch_conf(spark).contains("spark.sql.shuffle.partitions"):
        return None
    return partitions_for(default_parallelism(spark), input_bytes)
