"""Turning users' timestamps into what the stack's tables hold: UTC instants in microseconds.

Spark reads an Iceberg ``timestamptz`` column as ``timestamp``, the one time type a pipeline's
``Field`` has; a timezone-less Iceberg ``timestamp`` would read as Spark's ``timestamp_ntz``,
which no Field matches. So every time column is written as ``timestamp[us, tz=UTC]``:

* timestamps with a zone keep their instant;
* timezone-less ones are wall-clock times in a declared zone (``timezone``, default UTC);
* nanoseconds (pandas' resolution) are truncated to microseconds, Iceberg's, and counted;
* ISO-8601 strings are parsed, with or without a zone offset (``Z``, ``+02:00``);
* numbers are epoch times only in a declared unit (seconds, milliseconds, microseconds), and
  a value that lands outside 1900-2200 is refused with the unit it looks like instead.

Everything here is a pure function of Arrow arrays; a bad value is a :class:`LoadError` that
names the column, the row and the value.
"""

from __future__ import annotations

import re
import zoneinfo
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, get_args

import pyarrow as pa
import pyarrow.compute as pc

from flow.errors import ConfigError, LoadError

__all__ = [
    "EPOCH_UNITS",
    "UTC_US",
    "Converted",
    "EpochUnit",
    "TimeRules",
    "to_utc",
]

EpochUnit = Literal["s", "ms", "us"]
EPOCH_UNITS: tuple[str, ...] = get_args(EpochUnit)
Dst = Literal["raise", "earliest", "latest"]
UTC_US = pa.timestamp("us", tz="UTC")
_NAIVE_US = pa.timestamp("us")
_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 0}
# Instants outside these years are taken for a wrong epoch unit, not for real event times.
_LOW = int(datetime(1900, 1, 1, tzinfo=UTC).timestamp()) * 1_000_000
_HIGH = int(datetime(2200, 1, 1, tzinfo=UTC).timestamp()) * 1_000_000
_YEAR_1971 = 365 * 86_400 * 1_000_000
# A time of day followed by a zone: Z, +02, +0200, +02:00. (A date alone, 2024-05-01, has none.)
_ZONED = r"\d:\d\d(:\d\d(\.\d*)?)?\s*([Zz]|[+-]\d\d(:?\d\d)?)$"
_EXAMPLES = (
    "ISO-8601 such as 2024-05-01T12:00:00Z, 2024-05-01 12:00:00+02:00, or 2024-05-01 12:00:00 "
    "(read in --timezone)"
)


@dataclass(frozen=True)
class TimeRules:
    """How to read the time columns of one input."""

    timezone: str = "UTC"
    """The zone of timezone-less times (an IANA name: UTC, Europe/Paris, America/New_York)."""
    epoch_unit: EpochUnit | None = None
    """The unit of numeric times; None: a number in a time column is an error."""
    dst: Dst = "raise"
    """A timezone-less time that a daylight-saving change makes ambiguous or skips: an error,
    or its earliest / latest reading."""

    def __post_init__(self) -> None:
        try:
            zoneinfo.ZoneInfo(self.timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
            raise ConfigError(
                f"--timezone {self.timezone!r} is not a time zone; give an IANA name such as "
                "UTC, Europe/Paris or America/New_York"
            ) from exc
        if self.epoch_unit is not None and self.epoch_unit not in EPOCH_UNITS:
            raise ConfigError(
                f"--epoch-unit {self.epoch_unit!r} is not one of {', '.join(EPOCH_UNITS)}"
            )
        if self.dst not in get_args(Dst):
            raise ConfigError(f"--dst {self.dst!r} is not one of {', '.join(get_args(Dst))}")


@dataclass(frozen=True)
class Converted:
    """A time column as UTC microseconds, and what the conversion did (for the schema shown)."""

    values: pa.Array
    note: str
    truncated: int = 0
    """Values that lost sub-microsecond digits."""


def _where(column: str, row: int) -> str:
    return f"column {column!r}, row {row:,}"


def _first_bad(values: pa.Array, ok: pa.Array) -> int:
    """Index of the first non-null value whose ``ok`` is false."""
    bad = pc.and_(pc.is_valid(values), pc.invert(pc.fill_null(ok, False)))
    return int(pc.index(bad, True).as_py())


def _guess_unit(value: float) -> str:
    for unit, factor in (("s", 1_000_000), ("ms", 1_000), ("us", 1)):
        if _LOW <= value * factor < _HIGH:
            return f"it looks like {unit}: pass --epoch-unit {unit}"
    if _LOW <= value / 1000 < _HIGH:
        return "it looks like nanoseconds: divide by 1,000 first and pass --epoch-unit us"
    return "no unit puts it between 1900 and 2200; check the column"


def _localize(naive: pa.Array, rules: TimeRules, column: str, first_row: int) -> pa.Array:
    try:
        local = pc.assume_timezone(
            naive, timezone=rules.timezone, ambiguous=rules.dst, nonexistent=rules.dst
        )
    except pa.ArrowInvalid as exc:
        # Find the row: the first value that fails on its own.
        for i, value in enumerate(naive.to_pylist()):
            if value is None:
                continue
            try:
                pc.assume_timezone(
                    pa.array([value], naive.type),
                    timezone=rules.timezone,
                    ambiguous=rules.dst,
                    nonexistent=rules.dst,
                )
            except pa.ArrowInvalid:
                raise LoadError(
                    f"{_where(column, first_row + i)}: {value} does not exist or is ambiguous "
                    f"in {rules.timezone} (a daylight-saving change); pass --dst earliest or "
                    "--dst latest to pick a reading, or --timezone if the times are not "
                    f"{rules.timezone} times"
                ) from exc
        raise LoadError(f"column {column!r}: {exc}") from exc
    return local.cast(UTC_US)


def _truncated(values: pa.Array) -> int:
    """How many nanosecond timestamps have digits below the microsecond."""
    ints = values.cast(pa.int64())
    kept = pc.multiply(pc.divide(ints, 1000), 1000)
    return int(pc.sum(pc.not_equal(ints, kept)).as_py() or 0)


def _from_timestamps(values: pa.Array, rules: TimeRules, column: str, first_row: int) -> Converted:
    kind: pa.TimestampType = values.type
    truncated = _truncated(values) if kind.unit == "ns" else 0
    notes = []
    if kind.unit == "ns":
        notes.append(
            "nanoseconds -> microseconds" + (f" ({truncated:,} truncated)" if truncated else "")
        )
    if kind.tz is None:
        us = values.cast(_NAIVE_US, safe=False)
        out = _localize(us, rules, column, first_row)
        notes.append(f"timezone-less, read in {rules.timezone} (--timezone)")
    else:
        out = values.cast(UTC_US, safe=False)
        if kind.tz not in ("UTC", "+00:00", "Etc/UTC"):
            notes.append(f"{kind.tz} -> UTC")
    return Converted(out, "; ".join(notes), truncated)


def _from_numbers(values: pa.Array, rules: TimeRules, column: str, first_row: int) -> Converted:
    if rules.epoch_unit is None:
        i = int(pc.index(pc.is_valid(values), True).as_py())
        sample = values[i].as_py() if i >= 0 else None
        raise LoadError(
            f"{_where(column, first_row + max(i, 0))}: {sample!r} is a number, and epoch times "
            "need their unit: pass --epoch-unit s, ms or us"
        )
    factor = _PER_UNIT[rules.epoch_unit]
    if pa.types.is_floating(values.type):
        micros = pc.round(pc.multiply(values.cast(pa.float64()), float(factor))).cast(pa.int64())
    else:
        try:
            micros = pc.multiply_checked(values.cast(pa.int64()), factor)
        except pa.ArrowInvalid:  # overflow: far out of range; the check below names the row
            micros = pc.multiply(values.cast(pa.float64()), float(factor))
    ok = pc.and_(pc.greater_equal(micros, _LOW), pc.less(micros, _HIGH))
    if not pc.all(pc.fill_null(ok, True)).as_py():
        i = _first_bad(values, ok)
        value = values[i].as_py()
        raise LoadError(
            f"{_where(column, first_row + i)}: {value!r} read as epoch {rules.epoch_unit} is "
            f"outside 1900-2200; {_guess_unit(float(value))}"
        )
    unit = {"s": "seconds", "ms": "milliseconds", "us": "microseconds"}[rules.epoch_unit]
    note = f"epoch {unit} (--epoch-unit)"
    earliest = pc.min(micros).as_py()
    if earliest is not None and 0 <= earliest < _YEAR_1971:
        # In range, yet rarely meant: seconds read as milliseconds land in January 1970.
        note += f"; CHECK THE UNIT: times in 1970 ({_guess_unit(float(pc.min(values).as_py()))})"
    return Converted(micros.cast(pa.int64()).cast(UTC_US), note)


def _numeric_strings(values: pa.Array) -> pa.Array | None:
    """Numbers written as text (a CSV column of epoch times), or None if any value is not one."""
    for kind in (pa.int64(), pa.float64()):
        try:
            return values.cast(kind)
        except pa.ArrowInvalid:
            continue
    return None


def _from_strings(values: pa.Array, rules: TimeRules, column: str, first_row: int) -> Converted:
    text = pc.utf8_trim_whitespace(values.cast(pa.string()))
    text = pc.if_else(pc.equal(text, ""), pa.scalar(None, pa.string()), text)
    if rules.epoch_unit is not None:
        numbers = _numeric_strings(text)
        if numbers is not None:
            return _from_numbers(numbers, rules, column, first_row)
    # Iceberg keeps microseconds: drop further fraction digits before parsing.
    digits = pc.match_substring_regex(text, r"\.\d{7,}")
    truncated = int(pc.sum(pc.fill_null(digits, False)).as_py() or 0)
    text = pc.replace_substring_regex(text, r"(\.\d{6})\d+", r"\1")
    zoned = pc.fill_null(pc.match_substring_regex(text, _ZONED), False)
    null = pa.scalar(None, pa.string())
    try:
        with_zone = pc.if_else(zoned, text, null).cast(UTC_US)
        naive = pc.if_else(zoned, null, text).cast(_NAIVE_US)
    except pa.ArrowInvalid as exc:
        raise _unparsable(text, zoned, rules, column, first_row) from exc
    notes = []
    if not pc.all(zoned).as_py():
        localized = _localize(naive, rules, column, first_row)
        with_zone = pc.if_else(zoned, with_zone, localized)
        notes.append(f"text; without a zone offset read in {rules.timezone} (--timezone)")
    else:
        notes.append("text with zone offsets")
    if truncated:
        notes.append(f"{truncated:,} truncated to microseconds")
    return Converted(with_zone, "; ".join(notes), truncated)


def _unparsable(
    text: pa.Array, zoned: pa.Array, rules: TimeRules, column: str, first_row: int
) -> LoadError:
    for i, (value, has_zone) in enumerate(zip(text.to_pylist(), zoned.to_pylist(), strict=True)):
        if value is None:
            continue
        try:
            pa.array([value]).cast(UTC_US if has_zone else _NAIVE_US)
        except pa.ArrowInvalid:
            hint = (
                "it looks like an epoch time: pass --epoch-unit s, ms or us"
                if re.fullmatch(r"-?\d+(\.\d+)?", value)
                else f"write {_EXAMPLES}"
            )
            return LoadError(
                f"{_where(column, first_row + i)}: {value!r} is not a timestamp; {hint}"
            )
    return LoadError(f"column {column!r}: its values are not timestamps; write {_EXAMPLES}")


def to_utc(values: pa.Array, rules: TimeRules, column: str, first_row: int = 1) -> Converted:
    """``values`` (timestamps, text or epoch numbers) as UTC microseconds.

    ``first_row`` is the 1-based row of ``values[0]`` in the input, for error messages.
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    kind = values.type
    if pa.types.is_timestamp(kind):
        return _from_timestamps(values, rules, column, first_row)
    if pa.types.is_date(kind):
        naive = values.cast(_NAIVE_US)
        return Converted(
            _localize(naive, rules, column, first_row),
            f"date, midnight in {rules.timezone} (--timezone)",
        )
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return _from_numbers(values, rules, column, first_row)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return _from_strings(values, rules, column, first_row)
    if pa.types.is_null(kind):
        return Converted(pa.nulls(len(values), UTC_US), "no values (all null)")
    raise LoadError(
        f"column {column!r} is {kind}, which cannot be a time; name only time columns in "
        "--timestamp-columns"
    )
