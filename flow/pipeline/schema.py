"""Declared columns: the contract a source promises and bad input is checked against."""

from __future__ import annotations

import dataclasses
import difflib
import re
import reprlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from flow.errors import ConfigError

__all__ = [
    "NUMERIC_TYPES",
    "Definition",
    "Field",
    "FieldType",
    "check_identifier",
    "check_interval",
    "check_trigger",
    "did_you_mean",
    "interval_seconds",
]

FieldType = Literal[
    "string",
    "int",
    "long",
    "float",
    "double",
    "boolean",
    "timestamp",
    "array<string>",
    "array<long>",
]
FIELD_TYPES: tuple[str, ...] = get_args(FieldType)
NUMERIC_TYPES = frozenset({"int", "long", "float", "double"})
ARRAY_TYPES = frozenset({"array<string>", "array<long>"})

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]*$")
_INTERVAL = re.compile(r"^\d+ (second|minute|hour|day)s?$")
# What Spark's processingTime trigger parses (IntervalUtils, checked against Spark 4.1): one or
# more "<count> <unit>" parts, case-insensitive, a fraction only for seconds, nothing negative.
# Spark refuses months and years for triggers; "1 week" and "500 milliseconds" it takes.
_TRIGGER_PART = r"(\d+(\.\d+)?\s+seconds?|\d+\s+(microsecond|millisecond|minute|hour|day|week)s?)"
_TRIGGER = re.compile(rf"^(interval\s+)?{_TRIGGER_PART}(\s+{_TRIGGER_PART})*$", re.IGNORECASE)
_TRIGGER_EXAMPLES = "'10 seconds', '500 milliseconds', '1 minute', '1 minute 30 seconds'"


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the candidate closest to a mistyped ``name``, else ``""``:
    appended to an unknown-name error after its list of what exists."""
    close = difflib.get_close_matches(name, [c for c in candidates if c != name], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _check_arguments(kind: type, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Python's TypeError for a mistyped, missing or extra argument, as a ConfigError that names
    the class, the argument and what to write instead."""
    fields = [f for f in dataclasses.fields(kind) if f.init]
    names = [f.name for f in fields]
    kind_name = kind.__name__
    if len(args) > len(names):
        raise ConfigError(
            f"{kind_name} takes at most {len(names)} positional arguments ({', '.join(names)}), "
            f"not {len(args)}; name the others (key=value)"
        )
    for key, value in kwargs.items():
        if key not in names:
            raise ConfigError(
                f"{kind_name}({key}={reprlib.repr(value)}): {kind_name} has no field {key!r}; "
                f"its fields: {', '.join(names)}{did_you_mean(key, names)}"
            )
        if key in names[: len(args)]:
            raise ConfigError(
                f"{kind_name}: {key!r} is given twice, by position and as {key}=...; give it once"
            )
    given = {*names[: len(args)], *kwargs}
    missing = [
        f.name
        for f in fields
        if f.name not in given
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{kind_name} needs {', '.join(missing)}; give a value for each")


class _Checked(type):
    # The check sits in the metaclass's __call__, which runs only for `Kind(...)` written in
    # code: pickling, copy and Spark's closures rebuild objects through __new__, without it.
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        _check_arguments(cls, args, kwargs)
        return super().__call__(*args, **kwargs)


class Definition(metaclass=_Checked):
    """Base of the dataclasses a pipeline is written with (sources, stages, features, ...).

    A keyword the class does not have (``LabelJoin(windw=...)``), a missing field or one
    positional argument too many is a :class:`ConfigError` naming the class, the argument and
    the closest field, where Python would raise a TypeError (and ``flow run`` show a traceback).
    """

    __slots__ = ()


def check_identifier(value: str, what: str) -> None:
    """Column, stage, channel and source names: lower-case SQL identifiers."""
    if not _IDENTIFIER.match(value):
        raise ConfigError(f"{what}={value!r}: use lower-case letters, digits and _ (e.g. user_id)")


def check_interval(value: str, what: str) -> None:
    """Spark interval strings such as '10 minutes'."""
    if not _INTERVAL.match(value):
        raise ConfigError(
            f"{what}={value!r} is not an interval; write e.g. '30 seconds', '10 minutes'"
        )


_UNIT_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


def interval_seconds(value: str, what: str) -> int:
    """An interval :func:`check_interval` accepts, in seconds."""
    check_interval(value, what)
    count, unit = value.split()
    return int(count) * _UNIT_SECONDS[unit.rstrip("s")]


def check_trigger(value: str, what: str) -> None:
    """A streaming stage's micro-batch interval, as Spark's ``processingTime`` takes it."""
    written = value.strip()
    if written.lower().replace("_", "-") in {"once", "available-now", "availablenow"}:
        raise ConfigError(
            f"{what}={value!r}: the trigger is the micro-batch interval of --continuous runs, "
            "e.g. '10 seconds'; a run without --continuous already processes what has arrived "
            "and stops (Spark's availableNow)"
        )
    if not _TRIGGER.match(written):
        raise ConfigError(
            f"{what}={value!r} is not a micro-batch interval Spark accepts; write e.g. "
            f"{_TRIGGER_EXAMPLES} (units up to weeks; no months, years or negative values)"
        )


@dataclass(frozen=True)
class Field(Definition):
    """One declared column: its type and the values it may hold.

    Records that break the declaration (a required field missing, a value of the wrong type, out
    of ``min``..``max``, not among ``allowed``) go to the dead letters with the reason.
    """

    name: str
    type: FieldType
    required: bool = False
    """A record without this field is a dead letter."""
    min: float | None = None
    """Smallest allowed value (numeric types)."""
    max: float | None = None
    """Largest allowed value (numeric types)."""
    allowed: tuple[str, ...] | None = None
    """The only values allowed (string type)."""
    epoch: Literal["s", "ms", "us"] | None = None
    """A timestamp a Kafka record may give as a number: seconds, milliseconds or microseconds
    since 1970 (a JSON number or a string of digits). ISO-8601 text is read either way. A number
    outside Spark's timestamps (years 1 to 9999) makes the record a dead letter."""

    def __post_init__(self) -> None:
        check_identifier(self.name, "Field.name")
        if self.type not in FIELD_TYPES:
            known = ", ".join(FIELD_TYPES)
            raise ConfigError(
                f"Field {self.name!r}: type {self.type!r} is unknown; types: {known}"
                f"{did_you_mean(self.type, FIELD_TYPES)}"
            )
        if (self.min is not None or self.max is not None) and self.type not in NUMERIC_TYPES:
            raise ConfigError(f"Field {self.name!r}: min/max need a numeric type, not {self.type}")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ConfigError(f"Field {self.name!r}: min={self.min} is above max={self.max}")
        if self.epoch is not None:
            if self.epoch not in ("s", "ms", "us"):
                raise ConfigError(
                    f"Field {self.name!r}: epoch={self.epoch!r}; use 's', 'ms' or 'us'"
                )
            if self.type != "timestamp":
                raise ConfigError(
                    f"Field {self.name!r}: epoch needs type timestamp, not {self.type}"
                )
        if self.allowed is not None:
            if self.type != "string":
                raise ConfigError(f"Field {self.name!r}: allowed values need type string")
            if not self.allowed:
                raise ConfigError(f"Field {self.name!r}: allowed is empty; omit it or list values")

    @property
    def numeric(self) -> bool:
        return self.type in NUMERIC_TYPES

    @property
    def is_array(self) -> bool:
        return self.type in ARRAY_TYPES
