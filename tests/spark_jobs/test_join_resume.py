"""Whether a live stage's checkpoint survives its label join changing type, measured on Spark.

On 2026-11-28 the window strategy's join went from left outer to full outer, the immediate
strategy's positive branch from inner to right outer (so that a click that labels nothing is
counted). A plain join over file streams stands for the stage's plan (the same operators in the
same order before and after). What Spark 4.1 does, pinned here so that an upgrade that changes
it is noticed: it refuses both checkpoints (STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE), though the
only difference is a column's nullability (the inner or left outer join kept the clicks' time
as never null, an outer join's may be null), and the stage names the cause and stops without
restarting (spark_jobs.failures). Resuming would take Spark's schema check off
(``spark.sql.streaming.stateStore.stateSchemaCheck``) for every operator: not done.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.failures import root_cause

pytestmark = pytest.mark.integration

START = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def _write(folder: Path, name: str, rows: list[dict[str, Any]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _at(minutes: float) -> str:
    return (START + timedelta(minutes=minutes)).isoformat()


def _run(spark: SparkSession, root: Path, how: str) -> list[tuple[str | None, str | None]]:
    """One run of the join, ``how``, on the checkpoint under ``root``: the (event, click) pairs
    it emitted."""
    events = (
        spark.readStream.schema("id STRING, ts TIMESTAMP")
        .json(str(root / "events"))
        .withWatermark("ts", "10 minutes")
    )
    clicks = (
        spark.readStream.schema("click STRING, click_ts TIMESTAMP")
        .json(str(root / "clicks"))
        .withWatermark("click_ts", "10 minutes")
    )
    joined: DataFrame = events.join(
        clicks,
        (F.col("id") == F.col("click"))
        & (F.col("click_ts") >= F.col("ts"))
        & (F.col("click_ts") <= F.col("ts") + F.expr("INTERVAL 30 minutes")),
        how,
    )
    seen: list[tuple[str | None, str | None]] = []

    def collect(batch: DataFrame, _batch_id: int) -> None:
        seen.extend((r["id"], r["click"]) for r in batch.select("id", "click").collect())

    query = (
        joined.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(root / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return seen


def _before_the_change(spark: SparkSession, root: Path, how: str) -> None:
    spark.conf.set("spark.sql.streaming.multipleWatermarkPolicy", "min")
    _write(root / "events", "0", [{"id": "a", "ts": _at(0)}, {"id": "b", "ts": _at(1)}])
    _write(root / "clicks", "0", [{"click": "x", "click_ts": _at(1)}])
    first = _run(spark, root, how)
    assert ("a", "a") not in first  # a's click has not come yet: a waits in the join's state
    # After the upgrade, a's click arrives.
    _write(root / "clicks", "1", [{"click": "a", "click_ts": _at(5)}])


def test_a_checkpoint_made_before_the_join_became_outer_is_refused_and_named(
    spark: SparkSession, tmp_path: Path
) -> None:
    # The immediate strategy's positive branch, the default path's; the window strategy's
    # join (left outer -> full outer) is refused alike (measured once, 2026-11-28).
    _before_the_change(spark, tmp_path, "inner")
    with pytest.raises(StreamingQueryException) as refused:
        _run(spark, tmp_path, "right_outer")
    cause = root_cause(refused.value)
    assert cause is not None
    assert cause.kind == "checkpoint of another query", cause
