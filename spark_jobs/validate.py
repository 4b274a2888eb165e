"""Checking records against their declared fields, in Spark SQL; the rest become dead letters.

Every record gets a ``_reason``: empty when it is valid, else what is wrong with it, naming the
field, the value and the rule (``field 'position' = -3 is below the minimum 1``). Valid records
come out typed; invalid ones keep their raw bytes. Nothing here runs Python per row.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from flow.pipeline.schema import Field
from flow.pipeline.sources import KafkaSource
from spark_jobs.constants import batch_time

__all__ = [
    "DEAD_LETTER_COLUMNS",
    "REASON",
    "SPARK_TYPES",
    "barrier",
    "field_checks",
    "parse_kafka",
    "split",
    "time_checks",
    "validate_table",
    "with_time_checks",
]

REASON = "_reason"
SPARK_TYPES = {
    "string": "string",
    "int": "int",
    "long": "bigint",
    "float": "float",
    "double": "double",
    "boolean": "boolean",
    "timestamp": "timestamp",
    "array<string>": "array<string>",
    "array<long>": "array<bigint>",
}
#: The dead-letter table's columns, in order (see spark_jobs.sinks).
DEAD_LETTER_COLUMNS = (
    "source",
    "topic",
    "partition",
    "offset",
    "kafka_timestamp",
    "key",
    "raw",
    "reason",
)
_SNIPPET = 60


def _quoted(value: Column) -> Column:
    snippet = F.substring(value, 1, _SNIPPET)
    more = F.when(F.length(value) > _SNIPPET, F.lit("...")).otherwise(F.lit(""))
    return F.concat(F.lit("'"), snippet, more, F.lit("'"))


#: Spark's documented timestamp range, 0001-01-01 up to 10000-01-01, in seconds since 1970.
#: Epoch numbers past it are dead letters: converted, a millisecond count past ~9.2e15
#: overflows a long, which under ANSI mode fails the whole query at every replay of the batch;
#: seconds past ~9.2e12 saturate to year 294247 without a word; and a time such as year 58059,
#: which Spark holds, is one Python's datetime (a trainer's, ``collect()``) cannot.
_FIRST_SECOND, _END_SECOND = -62_135_596_800, 253_402_300_800
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000}


def _within_epoch_range(number: Column, unit: str) -> Column:
    """``number`` (in ``unit`` since 1970) is a time in Spark's range; false for NaN, which
    Spark orders above every number."""
    per_second = _PER_SECOND[unit]
    return (number >= F.lit(_FIRST_SECOND * per_second)) & (
        number < F.lit(_END_SECOND * per_second)
    )


def _outside_epoch_range(number: Column, unit: str) -> Column:
    """``number`` is a number (not null or NaN) outside Spark's timestamp range."""
    return number.isNotNull() & ~F.isnan(number) & ~_within_epoch_range(number, unit)


def field_checks(f: Field, typed: Column, raw: Column | None = None) -> list[Column]:
    """Reasons ``f`` is broken (null when it is fine): missing, wrong type, out of range."""
    checks = []
    if f.required:
        missing = raw.isNull() if raw is not None else typed.isNull()
        checks.append(F.when(missing, F.lit(f"missing required field '{f.name}'")))
    if raw is not None:
        unreadable = F.lit(f", which is not a {f.type}")
        if f.epoch is not None:
            unreadable = F.when(
                _outside_epoch_range(raw.try_cast("double"), f.epoch),
                F.lit(f", which is out of range for a timestamp in epoch {f.epoch} (years 1-9999)"),
            ).otherwise(unreadable)
        checks.append(
            F.when(
                raw.isNotNull() & typed.isNull(),
                F.concat(F.lit(f"field '{f.name}' has value "), _quoted(raw), unreadable),
            )
        )
    shown = typed.cast("string")
    if f.min is not None:
        checks.append(
            F.when(
                typed < F.lit(f.min),
                F.concat(
                    F.lit(f"field '{f.name}' = "), shown, F.lit(f" is below the minimum {f.min:g}")
                ),
            )
        )
    if f.max is not None:
        checks.append(
            F.when(
                typed > F.lit(f.max),
                F.concat(
                    F.lit(f"field '{f.name}' = "), shown, F.lit(f" is above the maximum {f.max:g}")
                ),
            )
        )
    if f.allowed is not None:
        checks.append(
            F.when(
                ~typed.isin(*f.allowed),
                F.concat(
                    F.lit(f"field '{f.name}' = "),
                    _quoted(typed),
                    F.lit(f" is not one of {', '.join(f.allowed)}"),
                ),
            )
        )
    return checks


def time_checks(event_time: Column, source: KafkaSource, now: Column | None = None) -> list[Column]:
    """Reasons an event time is implausible: further ahead of, or behind, the processing time
    (``now``: ``current_timestamp()`` unless given) than the source allows. In a stream that is
    the micro-batch's timestamp, kept in the query's offset log, so a replayed batch judges every
    record the same way."""
    now = F.current_timestamp() if now is None else now
    name = source.event_time
    shown = F.date_format(event_time, "yyyy-MM-dd HH:mm:ss")
    at = F.date_format(now, "yyyy-MM-dd HH:mm:ss")
    checks = []
    if source.max_future is not None:
        checks.append(
            F.when(
                event_time > now + F.expr(f"INTERVAL {source.max_future}"),
                F.concat(
                    F.lit(f"event time in the future: field '{name}' = "),
                    shown,
                    F.lit(" is more than "),
                    F.lit(source.max_future),
                    F.lit(" after the processing time "),
                    at,
                    F.lit(" (KafkaSource.max_future); fix the producer's clock"),
                ),
            )
        )
    if source.max_past is not None:
        checks.append(
            F.when(
                event_time < now - F.expr(f"INTERVAL {source.max_past}"),
                F.concat(
                    F.lit(f"event time too old: field '{name}' = "),
                    shown,
                    F.lit(" is more than "),
                    F.lit(source.max_past),
                    F.lit(" before the processing time "),
                    at,
                    F.lit(" (KafkaSource.max_past; None admits any age)"),
                ),
            )
        )
    return checks


_EPOCH = {"s": F.timestamp_seconds, "ms": F.timestamp_millis, "us": F.timestamp_micros}


def _typed(f: Field, raw: Column) -> Column:
    if f.is_array:
        return F.from_json(raw, SPARK_TYPES[f.type])
    if f.epoch is not None:  # a number in the declared unit, else ISO-8601 text
        number = raw.try_cast("double" if f.epoch == "s" else "bigint")
        # Checked before converting: out of range it is null, a dead letter (field_checks).
        in_range = F.when(_within_epoch_range(number, f.epoch), number)
        return F.coalesce(_EPOCH[f.epoch](in_range), raw.try_cast("timestamp"))
    return raw.try_cast(SPARK_TYPES[f.type])


def barrier(column: Column) -> Column:
    """``column``, marked non-deterministic (``spark_partition_id``): the projection computing
    it is an optimizer barrier. Without it Spark pushes a filter on the reason (valid records
    only) down through the parse and inlines the parse into every check that reads it, so
    ``from_json`` and each cast run once per check, not once per record: 200,000 records took
    15.1 s, 1.9 s for the parse alone (docs/experiments/2026-11-23-live-stage-rate.md)."""
    return F.when(F.spark_partition_id() >= 0, column)


_COORDINATES = ("key", "raw", "topic", "partition", "offset", "kafka_timestamp", "_size")


def parse_kafka(
    raw: DataFrame, source: KafkaSource, source_name: str, *, timed: bool = True
) -> DataFrame:
    """Kafka records as typed columns plus ``_reason`` and the record's coordinates.

    JSON is read into a string map first, so a missing field, a wrong type and a value out of
    range can each be told apart and named. Three projections: the JSON parsed once, each field
    typed once, then the checks read the typed fields. ``timed=False`` leaves the event time's
    checks to :func:`with_time_checks`.
    """
    records = raw.select(
        F.col("key"),
        F.col("value").alias("raw"),
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        F.length(F.col("value")).alias("_size"),
        barrier(F.from_json(F.col("value").cast("string"), "map<string,string>")).alias("_obj"),
    )
    typed = {f.name: _typed(f, F.col("_obj").getItem(f.name)) for f in source.fields}
    records = records.select(
        *_COORDINATES,
        "_obj",
        barrier(F.struct(*[c.alias(n) for n, c in typed.items()])).alias("_typed"),
    )
    checks: list[Column] = []
    for f in source.fields:
        checks.extend(
            field_checks(f, F.col("_typed").getField(f.name), F.col("_obj").getItem(f.name))
        )
    if timed:
        checks.extend(time_checks(F.col("_typed").getField(source.event_time), source))
    value = F.col("raw")
    reason = (
        F.when(value.isNull(), F.lit("empty record (null value)"))
        .when(
            F.col("_size") > source.max_payload_bytes,
            F.concat(
                F.lit("oversized record: "),
                F.col("_size").cast("string"),
                F.lit(
                    f" bytes, above KafkaSource.max_payload_bytes={source.max_payload_bytes}; "
                    "fix the producer or raise the limit"
                ),
            ),
        )
        .when(
            ~F.is_valid_utf8(value.cast("string")),
            F.concat(
                F.lit("not valid UTF-8 (a producer wrote other bytes): "),
                _quoted(F.make_valid_utf8(value.cast("string"))),
            ),
        )
        .when(
            F.col("_obj").isNull(),
            F.concat(F.lit("not a JSON object: "), _quoted(value.cast("string"))),
        )
        .otherwise(F.concat_ws("; ", *checks))
    )
    return records.select(
        *[F.col("_typed").getField(f.name).alias(f.name) for f in source.fields],
        F.lit(source_name).alias("source"),
        "topic",
        "partition",
        "offset",
        "kafka_timestamp",
        "key",
        "raw",
        reason.alias(REASON),
    )


def with_time_checks(parsed: DataFrame, source: KafkaSource) -> DataFrame:
    """``parsed`` (:func:`parse_kafka` with ``timed=False``) with the event time's checks in its
    reason, against the micro-batch's time read by :func:`spark_jobs.constants.batch_time`, so
    that no batch compiles classes of its own. Spark leaves an operator holding that expression
    out of whole-stage code generation, so a stream makes these checks apart from the parse,
    after the exchange that reads each topic once (spark_jobs.live.plan._read_once): the parse stays
    one compiled stage, the checks a small operator of their own."""
    checks = time_checks(F.col(source.event_time), source, batch_time())
    if not checks:
        return parsed
    # After the record's other faults; a record without a readable time has no time fault.
    reason = F.concat_ws("; ", F.nullif(F.col(REASON), F.lit("")), *checks)
    return parsed.withColumn(REASON, reason)


def validate_table(df: DataFrame, fields: tuple[Field, ...], source_name: str) -> DataFrame:
    """A typed table's rows with ``_reason`` and dead-letter columns (``raw``: the row as JSON)."""
    checks = [c for f in fields for c in field_checks(f, F.col(f.name))]
    reason = F.concat_ws("; ", *checks) if checks else F.lit("")
    columns = [f.name for f in fields]
    return df.select(
        *columns,
        F.lit(source_name).alias("source"),
        F.lit(None).cast("string").alias("topic"),
        F.lit(None).cast("int").alias("partition"),
        F.lit(None).cast("bigint").alias("offset"),
        F.lit(None).cast("timestamp").alias("kafka_timestamp"),
        F.lit(None).cast("binary").alias("key"),
        F.to_json(F.struct(*columns)).cast("binary").alias("raw"),
        reason.alias(REASON),
    )


def split(checked: DataFrame, fields: tuple[Field, ...]) -> tuple[DataFrame, DataFrame]:
    """(valid rows with the declared columns, dead letters with DEAD_LETTER_COLUMNS)."""
    valid = checked.where(F.col(REASON) == "").select(*[f.name for f in fields])
    dead = checked.where(F.col(REASON) != "").select(
        *DEAD_LETTER_COLUMNS[:-1], F.col(REASON).alias("reason")
    )
    return valid, dead
