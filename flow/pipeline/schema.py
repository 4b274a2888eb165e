"""Declared columns: the contract a source promises and bad input is checked against."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

from flow.errors import ConfigError

__all__ = ["NUMERIC_TYPES", "Field", "FieldType", "check_identifier", "check_interval"]

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


@dataclass(frozen=True)
class Field:
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

    def __post_init__(self) -> None:
        check_identifier(self.name, "Field.name")
        if self.type not in FIELD_TYPES:
            known = ", ".join(FIELD_TYPES)
            raise ConfigError(f"Field {self.name!r}: type {self.type!r} is unknown; types: {known}")
        if (self.min is not None or self.max is not None) and self.type not in NUMERIC_TYPES:
            raise ConfigError(f"Field {self.name!r}: min/max need a numeric type, not {self.type}")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ConfigError(f"Field {self.name!r}: min={self.min} is above max={self.max}")
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
