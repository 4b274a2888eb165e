"""The Criteo display-advertising format (``flow import criteo``), and a sample generator.

A Criteo file (Kaggle's ``train.txt``, the 1 TB click logs' ``day_N``) is tab separated with no
header: the label (1 clicked, 0 not), 13 integer features, 26 categorical features (32-bit
hashes written as 8 hex digits), an empty field for a missing value. The table gets ``label``
(int), ``i1``..``i13`` (long, null when missing) and ``c1``..``c26`` (string, null when
missing): lowercase, so that a pipeline's ``Field`` can name them.

The public files carry no time, but their rows are in time order (Kaggle's train.txt: 7 days,
~45.8 million rows). An event time makes a time-based split possible: ``start`` plus one row
every 1/``rows_per_second`` seconds (``ts``), or the row's position (``row_id``). With a time,
the import records where training ends on the table (``split_at``: a time, or a share of the
rows, 0.8 by default, so that a file of any size has rows on both sides); ``pipelines/criteo.py``
reads it back with :func:`recorded_split`.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from flow.config import StackConfig
from flow.errors import ConfigError, LoadError
from flow.stack.iceberg import open_catalog
from flow.workflows.ingest import Load, Mode, check_table_name, open_load
from flow.workflows.readers import open_csv
from flow.workflows.timestamps import UTC_US

__all__ = [
    "CATEGORICAL",
    "COLUMNS",
    "INTEGER",
    "SPLIT_PROPERTY",
    "CriteoOptions",
    "CriteoSample",
    "import_criteo",
    "recorded_split",
    "write_criteo_sample",
]

INTEGER = tuple(f"i{k}" for k in range(1, 14))
CATEGORICAL = tuple(f"c{k}" for k in range(1, 27))
COLUMNS = ("label", *INTEGER, *CATEGORICAL)
_TYPES: dict[str, pa.DataType] = {
    "label": pa.int32(),
    **dict.fromkeys(INTEGER, pa.int64()),
    **dict.fromkeys(CATEGORICAL, pa.string()),
}
_HINT = (
    "A Criteo file has 40 tab-separated fields a line: the label (0/1), 13 integers, 26 "
    "categorical values, missing ones empty; check the file"
)
SPLIT_PROPERTY = "flow.criteo.split-at"
"""The table property where the import records the first instant of the test rows."""
DEFAULT_SHARE = 0.8


@dataclass(frozen=True)
class CriteoOptions:
    """What ``flow import criteo`` adds and where it writes."""

    table: str
    start: datetime | None = None
    """The event time of the first row (``ts``); needs ``rows_per_second``."""
    rows_per_second: float | None = None
    """Rows per second of event time: row n is at ``start + n / rows_per_second``."""
    row_index: bool = False
    """Add ``row_id``, the row's position in the file from 0."""
    split_at: datetime | float | None = None
    """Where the training rows end, recorded on the table: a time (rows before it train, the
    rest test) or a share of the rows (0.8: the first 80% by event time train). Default with
    ``start``: 0.8, except for an append, which keeps the table's."""
    mode: Mode = "create"
    file_rows: int = 1_000_000

    @property
    def split(self) -> datetime | float | None:
        """``split_at``, or the default share when the rows get a time; an append keeps the
        table's split unless it is given one."""
        if self.split_at is None and self.start is not None and self.mode != "append":
            return DEFAULT_SHARE
        return self.split_at

    def __post_init__(self) -> None:
        check_table_name(self.table)
        if (self.start is None) != (self.rows_per_second is None):
            raise ConfigError(
                "--start and --rows-per-second go together: the first row's time and the "
                "spacing of the rows after it (Kaggle's train.txt: about 76 rows/s over 7 days)"
            )
        if self.rows_per_second is not None and self.rows_per_second <= 0:
            raise ConfigError(f"--rows-per-second {self.rows_per_second} must be positive")
        if self.start is not None and self.start.tzinfo is None:
            raise ConfigError(
                f"--start {self.start.isoformat()} has no zone; write it with one, e.g. "
                f"{self.start.isoformat()}Z"
            )
        if self.split_at is not None and self.start is None:
            raise ConfigError(
                "--split-at splits the rows by event time: give them one with --start and "
                "--rows-per-second"
            )
        if isinstance(self.split_at, datetime) and self.split_at.tzinfo is None:
            raise ConfigError(
                f"--split-at {self.split_at.isoformat()} has no zone; write it with one, e.g. "
                f"{self.split_at.isoformat()}Z"
            )
        if isinstance(self.split_at, float) and not 0 < self.split_at < 1:
            raise ConfigError(
                f"--split-at {self.split_at:g}: a share of the rows is between 0 and 1, e.g. 0.8 "
                "(the first 80% train)"
            )


class _Rows:
    """Checks labels and adds the event time and row index to each batch."""

    def __init__(self, options: CriteoOptions, source: str) -> None:
        self.options = options
        self.source = source
        self.notes = {"label": "1 clicked, 0 not"}
        if options.start is not None:
            self.notes["ts"] = (
                f"made: {options.start.isoformat()} + row / {options.rows_per_second:g} s"
            )
        if options.row_index:
            self.notes["row_id"] = "made: position in the file, from 0"
        self.before = 0
        """Rows whose ``ts`` is before a time ``split_at``."""

    def __call__(self, batch: pa.RecordBatch, first_row: int) -> pa.RecordBatch:
        label = batch.column("label")
        good = pc.fill_null(pc.is_in(label, pa.array([0, 1], pa.int32())), False)
        if not pc.all(good).as_py():
            i = int(pc.index(good, False).as_py())
            raise LoadError(
                f"{self.source}: row {first_row + i:,}: label {label[i].as_py()!r} is not 0 or "
                f"1; the first field of a Criteo line is the label. {_HINT}"
            )
        arrays, names = list(batch.columns), list(batch.schema.names)
        index = np.arange(first_row - 1, first_row - 1 + batch.num_rows, dtype=np.int64)
        if self.options.start is not None and self.options.rows_per_second is not None:
            start_us = int(self.options.start.timestamp() * 1_000_000)
            offsets = np.floor(index * (1_000_000 / self.options.rows_per_second))
            times = start_us + offsets.astype(np.int64)
            if isinstance(self.options.split_at, datetime):
                self.before += int((times < _micros(self.options.split_at)).sum())
            arrays.append(pa.array(times).cast(UTC_US))
            names.append("ts")
        if self.options.row_index:
            arrays.append(pa.array(index))
            names.append("row_id")
        return pa.RecordBatch.from_arrays(arrays, names=names)


def _micros(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000)


def _instant(micros: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)


class _Split:
    """Records where the training rows end on the table, once the rows are counted."""

    def __init__(self, options: CriteoOptions, rows: _Rows) -> None:
        self.options = options
        self.rows = rows

    def __call__(self, total: int) -> tuple[dict[str, str], str]:
        split, start, rate = self.options.split, self.options.start, self.options.rows_per_second
        if split is None or start is None or rate is None:
            return {}, ""
        if isinstance(split, datetime):
            at, train = split, self.rows.before
            asked = f"--split-at {split.isoformat()}"
        else:
            # Row k's time, as _Rows made it: the first row of the test rows.
            train = min(max(math.floor(split * total), 1), total - 1)
            at = _instant(_micros(start) + math.floor(train * (1_000_000 / rate)))
            asked = f"--split-at {split:g}"
        if not 0 < train < total:
            raise LoadError(
                f"{asked} puts {'all' if train else 'none'} of the {total:,} rows before it, "
                "leaving nothing to "
                + ("test on" if train else "train on")
                + "; give a time between the first and the last row's, or a share such as 0.8"
            )
        moment = at.astimezone(UTC).isoformat().replace("+00:00", "Z")
        return {SPLIT_PROPERTY: moment}, (
            f"train/test split at {moment} ({asked}): {train:,} rows train, "
            f"{total - train:,} test; recorded on {self.options.table} for pipelines/criteo.py"
        )


def recorded_split(stack: StackConfig, table: str) -> datetime:
    """The first instant of the test rows that ``flow import criteo`` recorded on ``table``."""
    catalog = open_catalog(stack.catalog)
    if not catalog.table_exists(table):
        raise ConfigError(
            f"table {table} does not exist; import it first: flow import criteo FILE --table "
            f"{table} --start 2024-01-01T00:00:00Z --rows-per-second 1"
        )
    value = catalog.load_table(table).properties.get(SPLIT_PROPERTY)
    if value is None:
        raise ConfigError(
            f"table {table} records no train/test split: import it again with --start and "
            "--rows-per-second (and --split-at, default 0.8), or pass criteo(split=...)"
        )
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def import_criteo(stack: StackConfig, path: Path, options: CriteoOptions) -> Load:
    """Open a Criteo file for loading into ``options.table`` (see :class:`Load`)."""
    if not path.exists():
        raise ConfigError(f"{path} does not exist; give the path of a Criteo file")
    opened = open_csv(
        path,
        pcsv.ParseOptions(delimiter="\t", quote_char=False),
        pcsv.ConvertOptions(
            column_types=_TYPES,
            null_values=[""],
            strings_can_be_null=True,
            quoted_strings_can_be_null=True,
        ),
        column_names=list(COLUMNS),
        hint=_HINT,
    )
    rows = _Rows(options, str(path))
    try:
        return open_load(
            stack,
            str(path),
            opened.batches,
            rows,
            opened=opened,
            table=options.table,
            mode=options.mode,
            notes=lambda: rows.notes,
            file_rows=options.file_rows,
            finish=_Split(options, rows),
        )
    except BaseException:
        opened.close()
        raise


@dataclass(frozen=True)
class CriteoSample:
    """What :func:`write_criteo_sample` wrote, for tests and docs to check against."""

    rows: int
    clicks: int
    p_click: np.ndarray = field(repr=False)
    """Each row's click probability under the known model."""
    missing: Mapping[str, int] = field(default_factory=dict)
    """Per column: rows left empty."""


def _hex_values(rng: np.random.Generator, size: int) -> np.ndarray:
    return np.array([f"{v:08x}" for v in rng.integers(0, 2**32, size=size)])


def write_criteo_sample(
    path: Path,
    rows: int = 10_000,
    *,
    seed: int = 3,
    missing: float = 0.1,
    progress: Callable[[str], None] | None = None,
) -> CriteoSample:
    """A Criteo-format file of ``rows`` rows (gzip when ``path`` ends in .gz) drawn from a known
    click model, so an import and a trainer can be checked against the truth.

    The model: a logit of -1.5, plus 0.4 log1p(i1) - 0.3 log1p(i2), plus a seeded effect of
    each value of c1 (s.d. 1) and c2 (s.d. 0.5). Values are Zipf-skewed; each integer and
    categorical field is empty with probability ``missing`` (``i1`` and ``c1`` then add 0).
    """
    if rows < 1:
        raise ConfigError(f"rows={rows} must be at least 1")
    if not 0 <= missing < 1:
        raise ConfigError(f"missing={missing} must be in [0, 1)")
    rng = np.random.default_rng(seed)
    columns: dict[str, pa.Array] = {}
    logit = np.full(rows, -1.5)
    counts: dict[str, int] = {}
    for k, name in enumerate(INTEGER):
        values = rng.geometric(1 / (2 + 3 * k), size=rows) - 1
        empty = rng.random(rows) < missing
        counts[name] = int(empty.sum())
        if name == "i1":
            logit += np.where(empty, 0.0, 0.4 * np.log1p(values))
        elif name == "i2":
            logit -= np.where(empty, 0.0, 0.3 * np.log1p(values))
        columns[name] = pa.array(values, mask=empty)
    for k, name in enumerate(CATEGORICAL):
        vocabulary = _hex_values(rng, 10 + 40 * k)
        drawn = np.minimum(rng.zipf(1.3, size=rows) - 1, len(vocabulary) - 1)
        empty = rng.random(rows) < missing
        counts[name] = int(empty.sum())
        if name in ("c1", "c2"):
            effect = rng.normal(0, 1.0 if name == "c1" else 0.5, size=len(vocabulary))
            logit += np.where(empty, 0.0, effect[drawn])
        columns[name] = pa.array(vocabulary[drawn], mask=empty)
    p_click = 1 / (1 + np.exp(-logit))
    label = (rng.random(rows) < p_click).astype(np.int32)
    table = pa.table({"label": label, **columns})
    options = pcsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as out:
            pcsv.write_csv(table, out, options)
    else:
        pcsv.write_csv(table, path, options)
    if progress is not None:
        progress(f"{rows:,} rows, {int(label.sum()):,} clicks to {path}")
    return CriteoSample(rows, int(label.sum()), p_click, counts)
