"""The Criteo display-advertising format (``flow import criteo``), and a sample generator.

A Criteo file (Kaggle's ``train.txt``, the 1 TB click logs' ``day_N``) is tab separated with no
header: the label (1 clicked, 0 not), 13 integer features, 26 categorical features (32-bit
hashes written as 8 hex digits), an empty field for a missing value. The table gets ``label``
(int), ``i1``..``i13`` (long, null when missing) and ``c1``..``c26`` (string, null when
missing): lowercase, so that a pipeline's ``Field`` can name them.

The public files carry no time, but their rows are in time order (Kaggle's train.txt: 7 days,
~45.8 million rows). An event time makes a time-based split possible: ``start`` plus one row
every 1/``rows_per_second`` seconds (``ts``), or the row's position (``row_id``).
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from flow.config import StackConfig
from flow.errors import ConfigError, LoadError
from flow.workflows.ingest import Load, Mode, check_table_name, open_load
from flow.workflows.readers import open_csv
from flow.workflows.timestamps import UTC_US

__all__ = [
    "CATEGORICAL",
    "COLUMNS",
    "INTEGER",
    "CriteoOptions",
    "CriteoSample",
    "import_criteo",
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
    mode: Mode = "create"
    file_rows: int = 1_000_000

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
            arrays.append(pa.array(start_us + offsets.astype(np.int64)).cast(UTC_US))
            names.append("ts")
        if self.options.row_index:
            arrays.append(pa.array(index))
            names.append("row_id")
        return pa.RecordBatch.from_arrays(arrays, names=names)


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
