"""What a live stage's micro-batch holds, row by row, and the SQL both writers judge it with.

The query hands its writer two kinds of rows in one batch (:data:`KIND`): every record the batch
read from Kafka (``record``), in the dead-letter layout with its reason ('' if valid) and its
event time, all in one struct (:data:`RECORD`); and the rows the label join emitted (``row``).
Of those, an event's first row counts as the event (:func:`first_row`: with ``immediate``
labels its positive is a second row), and a label event that labelled nothing is no event at
all (:func:`unmatched`): both writers tell them apart with these.
The stage's plan builds the records' side (:func:`record_column`, spark_jobs.live.plan); each
writer (spark_jobs.live.stream_writer, spark_jobs.live.inplan) tells them apart by the kind and
judges lateness with :func:`late_sql` and :func:`late_reason_sql`: Spark SQL text, with the
batch's threshold held out of the generated code (spark_jobs.constants.batch_value_sql).
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from flow.pipeline.model import LiveStage
from spark_jobs.constants import batch_value_sql
from spark_jobs.joins import UNMATCHED
from spark_jobs.validate import DEAD_LETTER_COLUMNS, REASON

__all__ = [
    "EVENT_TIME",
    "KIND",
    "RECORD",
    "first_row",
    "late_reason",
    "late_reason_sql",
    "late_sql",
    "record_column",
    "sql_name",
    "sql_string",
    "unmatched",
]

KIND = "_kind"
"""Which rows of a batch are records read (``record``) and which joined rows (``row``)."""
RECORD = "_record"
"""A record's dead-letter columns, reason and event time, as one struct (no name can clash
with the events' own columns in the union)."""
EVENT_TIME = "event_time"
"""The record's typed event time, inside :data:`RECORD`."""


def record_column(event_time: str) -> Column:
    """The :data:`RECORD` struct of a parsed source's rows (see spark_jobs.validate)."""
    return F.struct(
        *DEAD_LETTER_COLUMNS[:-1], F.col(REASON), F.col(event_time).alias(EVENT_TIME)
    ).alias(RECORD)


def sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def sql_name(*parts: str) -> str:
    """A column (or a struct's field: several parts) named in Spark SQL text."""
    return ".".join("`" + part.replace("`", "``") + "`" for part in parts)


_DELAY_SAID = sql_string(" (the source's watermark delay is ")


def late_sql(threshold_ms: int) -> str:
    """Whether a record (of :data:`RECORD`) is valid but at or before the threshold."""
    event_time = sql_name(RECORD, EVENT_TIME)
    return (
        f"({sql_name(RECORD, REASON)} = '' AND {event_time} IS NOT NULL "
        f"AND unix_millis({event_time}) <= {batch_value_sql(threshold_ms)})"
    )


def late_reason_sql(
    threshold_ms: int, watermarks: dict[str, str], record: str | None = None
) -> str:
    """A late record's reason, as Spark SQL text over the record's fields (those of the struct
    ``record``, or columns of their own)."""
    field = (record,) if record else ()
    event_time, threshold = sql_name(*field, EVENT_TIME), batch_value_sql(threshold_ms)
    delay = "CASE " + " ".join(
        f"WHEN {sql_name(*field, 'source')} = {sql_string(source)} THEN {sql_string(watermark)}"
        for source, watermark in watermarks.items()
    )
    delay = f"{delay} ELSE '' END" if watermarks else "''"
    when = "'yyyy-MM-dd HH:mm:ss'"
    return (
        "concat('late: event time ', "
        f"date_format({event_time}, {when}), ' is ', "
        # 1000.0D: a double, as the seconds were before (1000.0 is a decimal in SQL, and
        # format_number rounds a decimal's halves otherwise)
        f"format_number(({threshold} - unix_millis({event_time})) / 1000.0D, 1), "
        "' s behind the watermark ', "
        f"date_format(timestamp_millis({threshold}), {when}), "
        f"{_DELAY_SAID}, {delay}, ')')"
    )


def late_reason(threshold_ms: int, watermarks: dict[str, str]) -> Column:
    """A late record's reason, over its fields as columns of their own."""
    return F.expr(late_reason_sql(threshold_ms, watermarks))


def unmatched(stage: LiveStage) -> Column:
    """Whether a joined row is a label event that labelled nothing (spark_jobs.joins.UNMATCHED;
    never, for a stage without labels). False on a record's row (the column is null there)."""
    if stage.label is None:
        return F.lit(False)
    return F.coalesce(F.col(UNMATCHED), F.lit(False))


def first_row(stage: LiveStage) -> Column:
    """Whether a joined row is its event's first: the one that counts as the event. With
    ``immediate`` labels an event leaves again as a positive when its click comes; that row is
    no further event, so it is not counted as one, and a dead event's positive is left out with
    it. A label event alone (:func:`unmatched`) is no event's row."""
    label = stage.label
    if label is None:
        return F.lit(True)
    first = F.col(label.label_time).isNull() if label.strategy == "immediate" else F.lit(True)
    return first & ~unmatched(stage)
