"""What a streaming query knows about the micro-batch it is writing, read exactly and durably.

Two facts a ``foreachBatch`` writer needs to account for every record, which Spark does not hand
to it:

* **The late-event watermark.** A stateful operator drops an input row whose event time is at
  or before the watermark of the *previous* micro-batch (since Spark 3.4, a batch evicts state
  with its own watermark but judges lateness with the one before). Every batch's watermark is
  in the query's write-ahead offset log (``<checkpoint>/offsets/<batch>``, ``batchWatermarkMs``),
  written before the batch runs and kept across restarts, so a replayed batch finds the same
  threshold. :func:`late_threshold_ms` reads it; the writer dead-letters the rows below it, the
  ones Spark's operators drop, instead of letting them vanish.
* **The rows the stateful operators dropped.** Each operator counts its drops in its plan's
  metrics (``numRowsDroppedByWatermark``, ``numDroppedDuplicateRows``). While ``foreachBatch``
  runs, the query's ``lastExecution`` is this batch's plan, and once the writer has materialized
  the batch the counts are final: :func:`dropped_rows` sums them per operator kind. They are
  stored in the batch's own commit, so they survive restarts like every other count.

And one fact for the stage's report, read once at its end: **the events the label join holds**
(:func:`events_in_join`), the rows of the join's event side in the checkpoint's state, read by
Spark's state data source. Every event neither emitted nor a dead letter must be among them:
the bound that tells "pending" from "lost". (Spark's running count of state rows would give it
too, but its RocksDB store pays a read before every write for it: spark_jobs.live.plan turns it
off.)

The first two were checked on Spark 4.1 against the query progress Spark reports after each batch
(tests/faults/test_live_faults.py keeps checking them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from flow.storage import Location
from spark_jobs.jvm import last_execution

__all__ = [
    "Dropped",
    "dropped_rows",
    "events_in_join",
    "holds_a_join",
    "late_threshold_ms",
    "observed_metrics",
    "state_operators",
]


def late_threshold_ms(checkpoint: Location, batch_id: int) -> int:
    """Event times at or before this (ms since the epoch) are late in ``batch_id``: the
    watermark of the batch before it (0 for a query's first batch)."""
    if batch_id <= 0:
        return 0
    log = checkpoint.child("offsets")
    try:
        metadata = json.loads(log.read_bytes(str(batch_id - 1)).decode().splitlines()[1])
    except (OSError, IndexError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RuntimeError(
            f"the offset log {log}/{batch_id - 1} of the query's previous batch cannot be read "
            f"({exc}); the "
            "checkpoint is damaged or was written by another Spark version"
        ) from exc
    return int(metadata.get("batchWatermarkMs", 0))


@dataclass
class Dropped:
    """Rows a micro-batch's stateful operators dropped."""

    late: int = 0
    """Rows at or before the late-event watermark (every operator's, summed)."""
    duplicate_events: int = 0
    """Repeats of an event key within the watermark."""
    duplicate_labels: int = 0
    """Repeats of a label key within the watermark."""


def _children(node: Any) -> list[Any]:
    children = node.children()
    return [children.apply(i) for i in range(children.size())]


def _metric(node: Any, name: str) -> int:
    metrics = node.metrics()
    return int(metrics.apply(name).value()) if metrics.contains(name) else 0


def dropped_rows(spark: SparkSession, query_name: str, kind_of_keys: Any) -> Dropped:
    """What the stateful operators of the running batch of ``query_name`` dropped so far.

    Call it from the query's ``foreachBatch`` after the batch was materialized (persisted and
    counted), so every task has reported. ``kind_of_keys(text)`` names whose repeats a
    deduplication drops by its keys' text: ``events``, ``labels``, or ``again`` for a branch
    that sees events another branch counts already (its drops, late ones too, are left out).
    """
    found = Dropped()
    pending = [_last_execution(spark, query_name).executedPlan()]
    while pending:
        node = pending.pop()
        pending.extend(_children(node))
        late = _metric(node, "numRowsDroppedByWatermark")
        duplicates = _metric(node, "numDroppedDuplicateRows")
        if not late and not duplicates:
            continue
        kind = kind_of_keys(str(node.keyExpressions())) if duplicates or _is_dedup(node) else ""
        if kind == "again":
            continue
        found.late += late
        if kind == "labels":
            found.duplicate_labels += duplicates
        else:
            found.duplicate_events += duplicates
    return found


def _last_execution(spark: SparkSession, query_name: str) -> Any:
    """The running (or last) batch's execution of the active query ``query_name`` (JVM)."""
    query = next((q for q in spark.streams.active if q.name == query_name), None)
    if query is None:
        raise RuntimeError(f"no active streaming query is named {query_name!r}")
    return last_execution(query)


def observed_metrics(spark: SparkSession, query_name: str) -> dict[str, dict[str, Any]]:
    """The ``observe`` metrics of the running batch of ``query_name``, by name, once its job is
    done (call it from the query's ``foreachBatch`` after its action)."""
    metrics = _last_execution(spark, query_name).observedMetrics()
    found: dict[str, dict[str, Any]] = {}
    names = metrics.keys().iterator()
    while names.hasNext():
        name = names.next()
        row = metrics.apply(name)
        fields = row.schema().fieldNames()
        found[str(name)] = {str(f): row.get(i) for i, f in enumerate(fields)}
    return found


def _is_dedup(node: Any) -> bool:
    return "Deduplicate" in str(node.nodeName())


_JOIN = "symmetricHashJoin"
"""The stream-stream join's operator name in a checkpoint's state metadata."""


def state_operators(spark: SparkSession, checkpoint: Location) -> set[str]:
    """The names of the stateful operators whose state ``checkpoint`` holds (Spark's, as in
    its state metadata: ``symmetricHashJoin``, ``transformWithStateExec``, ...); none for a
    checkpoint not made yet (not asked of Spark, which would warn that it has no state)."""
    if not checkpoint.exists("state"):
        return set()
    rows = spark.read.format("state-metadata").load(checkpoint.hadoop_uri).collect()
    return {str(row["operatorName"]) for row in rows}


def holds_a_join(spark: SparkSession, checkpoint: Location) -> bool:
    """Whether ``checkpoint`` was made by a query with a stream-stream join (whose state a
    query without one could not take over)."""
    return _JOIN in state_operators(spark, checkpoint)


def events_in_join(spark: SparkSession, checkpoint: Location, batch_id: int) -> int | None:
    """Rows of the label join's event side (its left) in the state ``checkpoint`` holds after
    ``batch_id``; None if its query has no stream-stream join, or more than one."""
    uri = checkpoint.hadoop_uri
    joins = (
        spark.read.format("state-metadata")
        .load(uri)
        .where(F.col("operatorName") == _JOIN)
        .select("operatorId")
        .distinct()
        .collect()
    )
    if len(joins) != 1:
        return None
    state = (
        spark.read.format("statestore")
        .option("operatorId", joins[0]["operatorId"])
        .option("joinSide", "left")
        .option("batchId", batch_id)
        .load(uri)
    )
    return state.count()
