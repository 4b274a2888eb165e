"""Where rows come from: Kafka topics and Iceberg or Delta tables, with declared columns."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from flow.errors import ConfigError
from flow.pipeline.schema import (
    Definition,
    Field,
    check_identifier,
    check_interval,
    did_you_mean,
)

__all__ = ["PRODUCED_AT", "DeltaSource", "IcebergSource", "KafkaSource", "Source", "TableSource"]


def _fields(fields: tuple[Field, ...], owner: str) -> None:
    if not fields:
        raise ConfigError(f"{owner} declares no columns; list the Field()s the pipeline uses")
    names = [f.name for f in fields]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"{owner} declares {', '.join(duplicates)} more than once")


def _event_time(fields: tuple[Field, ...], event_time: str | None, owner: str) -> None:
    if event_time is None:
        return
    found = {f.name: f for f in fields}.get(event_time)
    if found is None:
        raise ConfigError(
            f"{owner}: event_time {event_time!r} is not a declared column; "
            f"columns: {', '.join(f.name for f in fields)}"
            f"{did_you_mean(event_time, (f.name for f in fields))}"
        )
    if found.type != "timestamp":
        raise ConfigError(f"{owner}: event_time {event_time!r} is {found.type}, not timestamp")


def _range(
    start: datetime | None, end: datetime | None, event_time: str | None, owner: str
) -> None:
    if (start or end) and event_time is None:
        raise ConfigError(f"{owner}: start/end filter on event time; set event_time too")
    if start and end and start >= end:
        raise ConfigError(f"{owner}: start {start} is not before end {end}")


PRODUCED_AT = "produced_at"
"""A column every stage's events have: when the record was produced, the Kafka record's
timestamp in a live stage (null for table rows). Pass it through (FeatureSpec.passthrough) to
measure freshness from production to training; a source field of that name takes its place."""


@dataclass(frozen=True)
class KafkaSource(Definition):
    """A Kafka topic of JSON records with a declared schema."""

    topic: str
    fields: tuple[Field, ...]
    event_time: str
    """The timestamp column watermarks and windows use."""
    watermark: str = "10 minutes"
    """How late a record may arrive and still count (Spark watermark delay)."""
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    """Where a stage without a checkpoint starts; afterwards the checkpoint decides."""
    max_payload_bytes: int = 64 * 1024
    """Larger records are dead letters ("oversized")."""
    max_records_per_batch: int | None = None
    """Cap on records per micro-batch (Spark maxOffsetsPerTrigger)."""
    key: str | None = None
    """A field that identifies an event: a repeat of a key within the watermark is dropped as a
    duplicate, and counted. A label join's key dedupes its label source without this."""
    max_future: str | None = "10 minutes"
    """The furthest an event time may be ahead of the processing time; a record beyond it is a
    dead letter ("event time in the future"), so one bad clock cannot move the watermark.
    None: no bound."""
    max_past: str | None = "30 days"
    """The furthest an event time may be behind the processing time; a record beyond it is a
    dead letter ("event time too old"). None: no bound (replaying a long-retention topic)."""

    def __post_init__(self) -> None:
        owner = f"KafkaSource({self.topic!r})"
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", self.topic):
            raise ConfigError(f"{owner}: not a legal Kafka topic name")
        _fields(self.fields, owner)
        _event_time(self.fields, self.event_time, owner)
        check_interval(self.watermark, f"{owner}.watermark")
        for bound in ("max_future", "max_past"):
            value = getattr(self, bound)
            if value is not None:
                check_interval(value, f"{owner}.{bound}")
        names = [f.name for f in self.fields]
        if self.key is not None and self.key not in names:
            raise ConfigError(
                f"{owner}: key {self.key!r} is not a declared field; fields: {', '.join(names)}"
                f"{did_you_mean(self.key, names)}"
            )
        if self.max_payload_bytes < 16:
            raise ConfigError(f"{owner}: max_payload_bytes={self.max_payload_bytes} is too small")
        if self.max_records_per_batch is not None and self.max_records_per_batch < 1:
            raise ConfigError(f"{owner}: max_records_per_batch must be at least 1")


@dataclass(frozen=True)
class IcebergSource(Definition):
    """An Iceberg table of the stack's catalog, read as of a snapshot, a time or incrementally.

    With none of ``snapshot_id``, ``as_of`` and ``since_snapshot``: the current snapshot.
    ``start``/``end`` keep rows whose ``event_time`` falls in ``[start, end)``.
    """

    table: str
    """``namespace.table`` in the stack's Iceberg catalog."""
    columns: tuple[Field, ...]
    """The columns the pipeline uses; checked against the table when the stage starts."""
    snapshot_id: int | None = None
    as_of: datetime | None = None
    """Time travel: the snapshot current at this time."""
    since_snapshot: int | None = None
    """Incremental: only rows appended by snapshots after this one (exclusive), up to now."""
    event_time: str | None = None
    start: datetime | None = None
    end: datetime | None = None

    def __post_init__(self) -> None:
        owner = f"IcebergSource({self.table!r})"
        parts = self.table.split(".")
        if len(parts) != 2:
            raise ConfigError(f"{owner}: name the table as namespace.table")
        for part in parts:
            check_identifier(part, f"{owner} name part")
        _fields(self.columns, owner)
        chosen = [
            n for n in ("snapshot_id", "as_of", "since_snapshot") if getattr(self, n) is not None
        ]
        if len(chosen) > 1:
            raise ConfigError(f"{owner}: choose one of {', '.join(chosen)}, not several")
        _event_time(self.columns, self.event_time, owner)
        _range(self.start, self.end, self.event_time, owner)

    @property
    def fields(self) -> tuple[Field, ...]:
        return self.columns


@dataclass(frozen=True)
class DeltaSource(Definition):
    """A Delta table by path (relative paths are under ``FLOW_LAKE``)."""

    path: str
    columns: tuple[Field, ...]
    version: int | None = None
    timestamp: datetime | None = None
    event_time: str | None = None
    start: datetime | None = None
    end: datetime | None = None

    def __post_init__(self) -> None:
        owner = f"DeltaSource({self.path!r})"
        if not self.path.strip():
            raise ConfigError("DeltaSource.path is empty")
        _fields(self.columns, owner)
        if self.version is not None and self.timestamp is not None:
            raise ConfigError(f"{owner}: choose version or timestamp, not both")
        _event_time(self.columns, self.event_time, owner)
        _range(self.start, self.end, self.event_time, owner)

    @property
    def fields(self) -> tuple[Field, ...]:
        return self.columns


TableSource = IcebergSource | DeltaSource
Source = KafkaSource | IcebergSource | DeltaSource
