"""The columns a stage has at each step, checked: what its events bring, what the label join and
each enrichment add, and what its features, label, weight and passthrough read.

:class:`~flow.pipeline.model.Pipeline` calls :func:`stage_columns` for every stage when it is
built; each error names the stage, the column and what is available instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from flow.errors import ConfigError
from flow.pipeline.features import (
    Bucketized,
    FeatureSpec,
    HashedSequence,
    Id,
    Numeric,
    feature_inputs,
    feature_name,
)
from flow.pipeline.history import History
from flow.pipeline.schema import Field, did_you_mean
from flow.pipeline.sources import (
    PRODUCED_AT,
    DeltaSource,
    IcebergSource,
    KafkaSource,
    Source,
)

if TYPE_CHECKING:
    from flow.pipeline.model import Stage

__all__ = ["HASHABLE_TYPES", "outside_spark", "stage_columns"]

HASHABLE_TYPES = frozenset({"string", "int", "long", "boolean", "array<string>", "array<long>"})
"""Column types whose ``cast(v AS string)`` (what a categorical feature hashes or looks up) the
Python transform reproduces exactly: flow.transform.spark_semantics."""

SourceLookup = Callable[..., Source]
"""``lookup(name, used_by=...)``: the pipeline's source of that name, or a ConfigError."""


def _names(mapping: dict[str, Field]) -> str:
    return ", ".join(sorted(mapping)) or "none"


def stage_columns(stage: Stage, source: SourceLookup) -> dict[str, Field]:
    where = f"stage {stage.name!r}"
    events = source(stage.events, used_by=f"{where} (events)")
    if stage.streaming and not isinstance(events, KafkaSource):
        raise ConfigError(f"{where} is a LiveStage: its events must be a KafkaSource")
    if not stage.streaming and isinstance(events, KafkaSource):
        raise ConfigError(
            f"{where} is a BackfillStage: its events must be an Iceberg or Delta table"
        )
    available: dict[str, Field] = {f.name: f for f in events.fields}
    origin = dict.fromkeys(available, stage.events)
    if PRODUCED_AT not in available:
        available[PRODUCED_AT] = Field(PRODUCED_AT, "timestamp")
        origin[PRODUCED_AT] = "the stage (the Kafka record's time)"

    for history in getattr(stage, "history", ()):  # a live stage has none
        _check_history(history, events, stage.events, where)
        _add(
            available,
            origin,
            Field(history.name, history.type),
            f"History({history.name!r})",
            where,
        )

    if stage.label is not None:
        label = stage.label
        other = source(label.source, used_by=f"{where} (label join)")
        if isinstance(other, KafkaSource) != isinstance(events, KafkaSource):
            raise ConfigError(
                f"{where}: the label join's source {label.source!r} must be a Kafka topic "
                "for a stream and a table for a batch, like the events"
            )
        for side, source_name, fields in (
            ("events", stage.events, available),
            ("label source", label.source, {f.name: f for f in other.fields}),
        ):
            if label.key not in fields:
                raise ConfigError(
                    f"{where}: label join key {label.key!r} is not a column of the {side} "
                    f"{source_name!r}; its columns: {_names(fields)}"
                    f"{did_you_mean(label.key, fields)}"
                )
        if other.event_time is None or events.event_time is None:
            raise ConfigError(f"{where}: a label join needs event_time on both sources")
        for new in (Field(label.label, "double"), Field(label.label_time, "timestamp")):
            _add(available, origin, new, "the label join", where)

    for enrich in stage.enrich:
        dim = source(enrich.source, used_by=f"{where} (enrich)")
        if not isinstance(dim, IcebergSource | DeltaSource):
            raise ConfigError(f"{where}: enrich source {enrich.source!r} must be a table")
        dim_fields = {f.name: f for f in dim.fields}
        if enrich.on not in available:
            raise ConfigError(
                f"{where}: enrich key {enrich.on!r} is not available from the events; "
                f"available: {_names(available)}{did_you_mean(enrich.on, available)}"
            )
        for column in (enrich.on, *enrich.columns):
            if column not in dim_fields:
                raise ConfigError(
                    f"{where}: enrich source {enrich.source!r} has no column {column!r}; its "
                    f"columns: {_names(dim_fields)}{did_you_mean(column, dim_fields)}"
                )
        for column in enrich.columns:
            added = Field(enrich.prefix + column, dim_fields[column].type)
            _add(available, origin, added, f"enrich {enrich.source!r}", where)

    for derived in stage.derive:
        _add(
            available,
            origin,
            Field(derived.name, derived.type),
            f"Derived({derived.name!r})",
            where,
        )

    _check_features(stage.features, available, where)
    return available


def _check_history(history: History, source: Source, events: str, where: str) -> None:
    """A history reads the events' own columns: the context rows before a partial read are
    read from the events' table alone, without the label join or the enrichments."""
    if source.event_time is None:
        raise ConfigError(
            f"{where}: History({history.name!r}) orders {events!r} by event time; give the "
            "source an event_time"
        )
    fields = {f.name: f for f in source.fields}
    for role, column in (("key", history.key), ("value", history.value)):
        if column is None:
            continue
        if column not in fields:
            raise ConfigError(
                f"{where}: History({history.name!r}).{role} {column!r} is not a column of the "
                f"events {events!r} (a history reads the events' own columns, not a joined "
                f"label); its columns: {_names(fields)}{did_you_mean(column, fields)}"
            )
    if history.value is not None and history.stat != "count":
        kind = fields[history.value].type
        if kind not in _SUMMABLE:
            raise ConfigError(
                f"{where}: History({history.name!r}) takes the {history.stat} of "
                f"{history.value!r}, a {kind}; give a numeric column (derive one in the "
                "events' table, e.g. a 0/1 label)"
            )


_SUMMABLE = frozenset({"int", "long", "float", "double", "boolean"})


def _add(
    available: dict[str, Field], origin: dict[str, str], new: Field, by: str, where: str
) -> None:
    if new.name in available:
        raise ConfigError(
            f"{where}: {by} adds column {new.name!r}, which {origin[new.name]!r} already has; "
            "set a prefix (Enrich) or another name (LabelJoin.label)"
        )
    available[new.name] = new
    origin[new.name] = by


def _check_features(spec: FeatureSpec, available: dict[str, Field], where: str) -> None:
    def need(column: str, user: str) -> Field:
        if column not in available:
            raise ConfigError(
                f"{where}: {user} reads column {column!r}, which does not exist here; "
                f"available: {_names(available)}{did_you_mean(column, available)}"
            )
        return available[column]

    for feature in spec.features:
        user = f"feature {feature_name(feature)!r}"
        for column in feature_inputs(feature):
            found = need(column, user)
            if isinstance(feature, Id) and found.type not in ("int", "long"):
                raise ConfigError(
                    f"{where}: {user} is an Id, which needs an integer column; {column!r} is "
                    f"{found.type} (hash a string id with Hashed instead)"
                )
            if isinstance(feature, Numeric | Bucketized) and not found.numeric:
                raise ConfigError(f"{where}: {user} needs a number; {column!r} is {found.type}")
            if isinstance(feature, HashedSequence) and not found.is_array:
                raise ConfigError(f"{where}: {user} needs an array; {column!r} is {found.type}")
            if not isinstance(feature, HashedSequence) and found.is_array:
                raise ConfigError(
                    f"{where}: {user} reads array column {column!r}; use HashedSequence for it"
                )
    label = need(spec.label, "the label")
    if not label.numeric:
        raise ConfigError(f"{where}: the label {spec.label!r} is {label.type}, not a number")
    if isinstance(spec.weight, str) and not need(spec.weight, "the weight").numeric:
        raise ConfigError(f"{where}: the weight {spec.weight!r} is not a number")
    for column in spec.passthrough:
        need(column, "passthrough")


def outside_spark(spec: FeatureSpec, columns: dict[str, Field]) -> list[str]:
    """Why ``spec`` cannot be applied outside Spark over ``columns`` (empty: it can).

    A categorical feature hashes or looks up its value's text, ``cast(v AS string)``; the
    Python transform reproduces that text for strings, integers and booleans only. A double's
    is Java's ``Double.toString`` (``1.0E7``; JDK 17 writes ``4.9E-324`` for Python's
    ``5e-324``), a timestamp's depends on the session time zone."""
    reasons = []
    for feature in spec.features:
        if isinstance(feature, Numeric | Bucketized):
            continue
        for column in feature_inputs(feature):
            found = columns.get(column)
            if found is not None and found.type not in HASHABLE_TYPES:
                reasons.append(
                    f"feature {feature_name(feature)!r} hashes or looks up {column!r}, a "
                    f"{found.type} column, whose text Spark writes in its own way; cast it to "
                    "a string or an integer in a Derived column first"
                )
    return reasons
