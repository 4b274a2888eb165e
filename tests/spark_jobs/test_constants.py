"""Values that change every micro-batch stay out of the Java code Spark generates, so a plan made
again with another value reuses its compiled classes (spark_jobs.constants)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.constants import batch_time, batch_value
from spark_jobs.jvm import classes_compiled, codegen_text

pytestmark = pytest.mark.integration


def _generated_code(df: DataFrame) -> list[str]:
    """The Java source Spark generates for ``df``'s plan (its codegen explain, code lines only:
    the plan's description above them names expression ids and values)."""
    return [line for line in codegen_text(df).splitlines() if line.startswith("/* ")]


def _plan(spark: SparkSession, value: Column) -> DataFrame:
    return spark.range(4).select((F.col("id") + value).alias("x"))


def test_a_held_value_leaves_the_generated_code_the_same(spark: SparkSession) -> None:
    first, second = _plan(spark, batch_value(1_795_481_402_081)), _plan(spark, batch_value(7))
    assert [r["x"] for r in first.collect()] == [1_795_481_402_081 + i for i in range(4)]
    assert [r["x"] for r in second.collect()] == [7, 8, 9, 10]
    assert _generated_code(first) == _generated_code(second)
    # The contrast: a plain literal is written into the code.
    assert _generated_code(_plan(spark, F.lit(1_795_481_402_081))) != _generated_code(
        _plan(spark, F.lit(7))
    )


def test_a_held_int_hashes_as_the_literal_does(spark: SparkSession) -> None:
    """The export's buckets (xxhash64 with the seed) are what they were with a literal seed."""
    rows = spark.range(50).select(
        F.xxhash64(F.col("id").cast("string"), batch_value(3, "int")).alias("held"),
        F.xxhash64(F.col("id").cast("string"), F.lit(3)).alias("literal"),
    )
    assert all(r["held"] == r["literal"] for r in rows.collect())


def _compiled(spark: SparkSession) -> int:
    """Classes Spark has compiled so far (its codegen cache's misses, across the JVM)."""
    return classes_compiled(spark)


def _second_batch(spark: SparkSession, now: Column, folder: Path) -> tuple[int, list[int]]:
    """A stream of JSON files checked against ``now``, two micro-batches: the classes its second
    batch compiled, and ``now`` (epoch micros) as each batch saw it."""
    source = folder / "in"
    source.mkdir(parents=True)
    (source / "0.json").write_text(json.dumps({"id": 0}) + "\n")
    rows = spark.readStream.schema("id LONG").json(str(source))
    query = (
        rows.select("id", F.unix_micros(now).alias("now"))
        .writeStream.format("memory")
        .queryName(f"batch_time_{folder.name}")
        .option("checkpointLocation", str(folder / "checkpoint"))
        .start()
    )
    try:
        query.processAllAvailable()
        before = _compiled(spark)
        (source / "1.json").write_text(json.dumps({"id": 1}) + "\n")
        query.processAllAvailable()
        compiled = _compiled(spark) - before
    finally:
        query.stop()
    seen = spark.sql(f"SELECT now FROM batch_time_{folder.name} ORDER BY id").collect()
    return compiled, [int(r["now"]) for r in seen]


def test_a_streams_batch_time_compiles_nothing_new_in_the_next_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    """In a stream Spark writes the batch's time into the code after the optimizer has run, so
    ``held`` cannot keep it out; ``batch_time`` does, and is each batch's own time."""
    compiled, times = _second_batch(spark, batch_time(), tmp_path / "batch_time")
    assert compiled == 0
    assert times[0] < times[1]  # each batch's own time
    compiled, _ = _second_batch(spark, F.current_timestamp(), tmp_path / "plain")
    assert compiled > 0  # the contrast: the literal made a new class


def test_the_batch_time_is_the_query_time(spark: SparkSession) -> None:
    row = spark.range(1).select(batch_time().alias("held"), F.current_timestamp().alias("now"))
    found = row.first()
    assert found is not None
    assert isinstance(found["held"], datetime)
    assert found["held"] == found["now"]
