"""A backfill's point-in-time history columns (flow.pipeline.history): Spark windows over each
key's events, ordered by event time in microseconds, whose frame ends one microsecond before
the row, so rows of the same instant never see each other (a label would leak into its own
row's feature otherwise).

A stage that reads part of its table gets the rows before that part as context
(:func:`context_sources`): they enter the windows and leave before anything else sees them, so
they are neither counted, dead letters nor training rows.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from flow.pipeline.history import History
from flow.pipeline.sources import IcebergSource, TableSource

__all__ = ["context_sources", "with_history"]

CONTEXT = "__flow_history_context"


def context_sources(source: TableSource, snapshot: int | None = None) -> list[TableSource]:
    """The reads that hold ``source``'s rows before its own read: none for a whole table;
    the rows before ``start``; for an incremental read (``since_snapshot``), the table as of
    that snapshot and the increment's rows before ``start``. Rows after the stage's rows in
    event time may be among them: the windows' frames leave them out. ``snapshot``: the one
    the stage's own read of an Iceberg table used; a context read of the table as it is now
    reads it too, so a commit between the two reads cannot put a row in both or neither."""
    parts: list[TableSource] = []
    if isinstance(source, IcebergSource) and source.since_snapshot is not None:
        parts.append(
            replace(source, since_snapshot=None, snapshot_id=source.since_snapshot, start=None)
        )
    if source.start is not None:
        earlier = replace(source, start=None, end=source.start)
        if isinstance(earlier, IcebergSource) and snapshot is not None and _current(earlier):
            earlier = replace(earlier, snapshot_id=snapshot)
        parts.append(earlier)
    return parts


def _current(source: IcebergSource) -> bool:
    return source.snapshot_id is None and source.as_of is None and source.since_snapshot is None


def _micros(span: timedelta) -> int:
    return span.days * 86_400_000_000 + span.seconds * 1_000_000 + span.microseconds


def _aggregate(history: History, event_time: str) -> Column:
    lower = Window.unboundedPreceding if history.within is None else -_micros(history.within)
    window = (
        Window.partitionBy(history.key)
        .orderBy(F.unix_micros(F.col(event_time)))
        .rangeBetween(lower, -1)
    )
    value = F.lit(1) if history.value is None else F.col(history.value).cast("double")
    if history.stat == "count":
        found = F.count(value).over(window)
    elif history.stat == "sum":
        found = F.coalesce(F.sum(value).over(window), F.lit(0.0))
    else:
        found = F.avg(value).over(window)
    known = F.col(history.key).isNotNull() & F.col(event_time).isNotNull()
    return F.when(known, found).cast(history.type)


def with_history(
    rows: DataFrame,
    histories: tuple[History, ...],
    event_time: str,
    context: DataFrame | None = None,
) -> DataFrame:
    """``rows`` with one column per history, from their own events and ``context``'s."""
    if not histories:
        return rows
    if context is not None:
        needed = sorted({c for h in histories for c in h.inputs} | {event_time})
        rows = rows.withColumn(CONTEXT, F.lit(False)).unionByName(
            context.select(*needed).withColumn(CONTEXT, F.lit(True)),
            allowMissingColumns=True,
        )
    for history in histories:
        rows = rows.withColumn(history.name, _aggregate(history, event_time))
    if context is not None:
        rows = rows.where(~F.col(CONTEXT)).drop(CONTEXT)
    return rows
