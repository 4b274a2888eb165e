"""The immediate strategy's positives from the project's transformWithState processor
(flow.spark.ImmediatePositives) against Spark's right outer stream-stream join, on Spark.

The same events and label events reach both over file streams in four steps, each one run of
the query (``availableNow``) from its checkpoint, so every step also restarts the query and the
processor's state and timers come back from the checkpoint. Both must emit exactly the rows
this module expects: a positive when a label event comes within the window (before or after its
event), none outside it, one for a repeated label event, none for a repeated or a late event,
and each label event that labelled nothing alone once the watermark has passed it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from flow.pipeline.model import LabelJoin
from flow.storage import location
from spark_jobs.joins import UNMATCHED, label_stream_immediate
from spark_jobs.live.batch_facts import holds_a_join, state_operators

pytestmark = pytest.mark.integration

START = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
LABEL = LabelJoin(source="clicks", key="id", window="30 minutes", strategy="immediate")
Seen = tuple[str | None, datetime | None, datetime | None, datetime | None, bool]


def _at(minutes: float) -> datetime:
    return START + timedelta(minutes=minutes)


def _row(key: str | None, minutes: float, produced: float) -> dict[str, Any]:
    return {"id": key, "ts": _at(minutes).isoformat(), "produced_at": _at(produced).isoformat()}


# (events, label events) of each step: (key, event time, when produced), minutes after START.
STEPS: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = [
    (
        [_row("k1", 0, 0), _row("k2", 0, 0), _row("k3", 0, 0), _row("k5", 1, 1)],
        # k4's click comes before its impression; a click without a key labels nothing.
        [_row("k1", 5, 5.5), _row("k4", 1, 1), _row(None, 2, 2)],
    ),
    (
        # k1's impression again (a repeat: k1's click below must not label it twice).
        [_row("k4", 0.5, 0.5), _row("k1", 0, 3)],
        # k2's click is 40 minutes late (outside its window); k1's click again; k5's click on
        # the window's last instant.
        [_row("k2", 40, 40), _row("k1", 6, 6), _row("k5", 31, 31)],
    ),
    # The watermark moves to 70 minutes: k2's click and the keyless one are passed.
    ([_row("k9", 80, 80)], [_row("k9", 81, 82)]),
    # k11's impression comes late (65 < 70): dropped, so its click in time labels nothing (it
    # waits for the watermark to pass it, after the last step).
    ([_row("k10", 90, 90), _row("k11", 65, 91)], [_row("k11", 85, 91)]),
]

EXPECTED: set[Seen] = {
    ("k1", _at(0), _at(5), _at(5.5), False),
    ("k4", _at(0.5), _at(1), _at(1), False),
    ("k5", _at(1), _at(31), _at(31), False),
    ("k9", _at(80), _at(81), _at(82), False),
    (None, None, _at(40), _at(40), True),
    (None, None, _at(2), _at(2), True),
}


def _run(spark: SparkSession, root: Path, positives: str) -> list[Seen]:
    events = spark.readStream.schema("id STRING, ts TIMESTAMP, produced_at TIMESTAMP").json(
        str(root / "events")
    )
    clicks = spark.readStream.schema("id STRING, ts TIMESTAMP, produced_at TIMESTAMP").json(
        str(root / "clicks")
    )
    rows = label_stream_immediate(
        events, clicks, LABEL, "ts", "10 minutes", "ts", "10 minutes", positives=positives
    )
    seen: list[Seen] = []

    def collect(batch: DataFrame, _batch_id: int) -> None:
        for r in batch.where("label = 1.0").collect():
            seen.append((r["id"], r["ts"], r["label_time"], r["produced_at"], r[UNMATCHED]))

    query = (
        rows.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(root / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return seen


def _steps(spark: SparkSession, root: Path, positives: str) -> list[Seen]:
    seen: list[Seen] = []
    for n, (events, clicks) in enumerate(STEPS):
        for name, rows in (("events", events), ("clicks", clicks)):
            (root / name).mkdir(parents=True, exist_ok=True)
            (root / name / f"{n}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
        seen += _run(spark, root, positives)
    return [(key, _utc(ts), _utc(at), _utc(made), gone) for key, ts, at, made, gone in seen]


def _utc(time: datetime | None) -> datetime | None:
    """A time Spark handed back (naive, in the session's zone: UTC), made aware."""
    return time.replace(tzinfo=UTC) if time is not None else None


@pytest.mark.parametrize("positives", ["processor", "join"])
def test_the_processor_and_the_join_emit_the_same_positives_across_restarts(
    rocksdb: SparkSession, tmp_path: Path, positives: str
) -> None:
    spark = rocksdb
    seen = _steps(spark, tmp_path, positives)
    assert sorted(seen, key=repr) == sorted(EXPECTED, key=repr)  # each once, none twice
    checkpoint = location(str(tmp_path / "checkpoint"))
    made = state_operators(spark, checkpoint)
    assert ("transformWithStateExec" in made) == (positives == "processor"), made
    assert holds_a_join(spark, checkpoint) == (positives == "join")
