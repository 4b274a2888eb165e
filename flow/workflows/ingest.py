"""Loading a user's own file into an Iceberg table of the stack's catalog (``flow load``).

The file is read in batches (:mod:`flow.workflows.readers`), each batch converted to types
Iceberg and the pipelines take (time columns to UTC microseconds by
:mod:`flow.workflows.timestamps`; unsigned integers, half floats, dictionaries widened), and
written in one Iceberg transaction: a load that fails half-way leaves the table as it was, and
deletes the data files and manifests it had written (pyiceberg writes them before the commit).
The plan (every column's type in the file, in the table and as a pipeline ``Field``) comes from
the first batch, before anything is written, so ``--dry-run`` can show it alone.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.io import FileIO, InputFile, OutputFile
from pyiceberg.table import Transaction

from flow.config import StackConfig
from flow.errors import ConfigError, LoadError
from flow.pipeline.schema import FIELD_TYPES, did_you_mean
from flow.stack.iceberg import open_catalog
from flow.transform.serving import ARROW_TYPES
from flow.workflows.readers import Format, Input, detect_format, open_input
from flow.workflows.timestamps import UTC_US, TimeRules, to_utc

__all__ = [
    "ColumnPlan",
    "Finish",
    "Load",
    "LoadOptions",
    "LoadPlan",
    "LoadReport",
    "Mode",
    "Progress",
    "check_table_name",
    "field_type",
    "load_file",
    "open_load",
]

Mode = Literal["create", "append", "replace"]
Progress = Callable[[int, int, int | None], None]
"""Called with (rows written so far, units done, units in all or None)."""
Finish = Callable[[int], tuple[Mapping[str, str], str]]
"""Called with the rows written, before the commit: table properties to set in the same
commit, and a line for the user. Raising a LoadError there writes nothing."""

_FIELD_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
_LABEL = re.compile(r"^\s*(?P<column>.+?)\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<value>-?\d+(\.\d+)?)\s*$")
_COMPARE = {
    ">=": pc.greater_equal,
    ">": pc.greater,
    "<=": pc.less_equal,
    "<": pc.less,
    "==": pc.equal,
    "!=": pc.not_equal,
}


def _quiet(_rows: int, _done: int, _total: int | None) -> None:
    return None


def check_table_name(name: str) -> tuple[str, str]:
    """``namespace.table`` split in two, or a ConfigError saying how to write it."""
    parts = name.split(".")
    if len(parts) != 2 or not all(_FIELD_NAME.match(p) for p in parts):
        raise ConfigError(
            f"--table {name!r}: name it namespace.table, each part lowercase letters, digits and "
            "_ (e.g. movies.ratings), as a pipeline's IcebergSource does"
        )
    return parts[0], parts[1]


@dataclass(frozen=True)
class LoadOptions:
    """What ``flow load`` does with a file; options name columns as the file does."""

    table: str
    """``namespace.table`` in the stack's catalog."""
    format: Format | None = None
    """csv, parquet or json (lines); None: from the file name."""
    timestamp_columns: tuple[str, ...] = ()
    """Columns holding times as text or epoch numbers (timestamp columns are found anyway)."""
    time: TimeRules = field(default_factory=TimeRules)
    types: Mapping[str, str] = field(default_factory=dict)
    """Column -> Field type (string, long, double, timestamp, ...), instead of the inferred."""
    renames: Mapping[str, str] = field(default_factory=dict)
    """Column -> its name in the table."""
    label: str | None = None
    """A 0/1 ``label`` column from a comparison, e.g. ``rating>=4``."""
    delimiter: str | None = None
    """CSV: the field separator (default ``,``; ``\\t`` for .tsv files)."""
    mode: Mode = "create"
    """create: refuse an existing table; append: add rows; replace: replace the table."""
    add_columns: bool = False
    """append: add the file's columns the table lacks to it (its rows read null in them);
    without it such columns are an error that names them."""
    file_rows: int = 1_000_000
    """Rows per data file written (the batches read are gathered up to this)."""
    block_bytes: int = 4 << 20
    """CSV and JSON: bytes read at a time (a batch); larger than the longest line."""

    def __post_init__(self) -> None:
        check_table_name(self.table)
        if self.mode not in get_args(Mode):
            raise ConfigError(f"mode {self.mode!r} is not one of {', '.join(get_args(Mode))}")
        for column, kind in self.types.items():
            if kind not in FIELD_TYPES:
                raise ConfigError(
                    f"--type {column}={kind}: {kind!r} is not a Field type; types: "
                    f"{', '.join(FIELD_TYPES)}{did_you_mean(kind, FIELD_TYPES)}"
                )
        if self.time.epoch_unit and not self.time_columns:
            raise ConfigError(
                "--epoch-unit needs the columns it applies to: name them with --timestamp-columns"
            )
        if self.label is not None and not _LABEL.match(self.label):
            raise ConfigError(
                f"--label {self.label!r}: write a comparison of a column with a number, e.g. "
                "'rating>=4' (>=, >, <=, <, ==, !=)"
            )
        if self.file_rows < 1:
            raise ConfigError(f"file_rows={self.file_rows} must be at least 1")
        if self.add_columns and self.mode != "append":
            raise ConfigError(
                "--add-columns adds a file's new columns to a table it appends to: "
                "pass it with --append"
            )

    @property
    def time_columns(self) -> tuple[str, ...]:
        declared = [c for c, kind in self.types.items() if kind == "timestamp"]
        return tuple(dict.fromkeys([*self.timestamp_columns, *declared]))


def field_type(kind: pa.DataType) -> str | None:
    """The pipeline Field type of an Arrow type as the table stores it (None: no Field has it)."""
    if pa.types.is_large_string(kind):
        kind = pa.string()
    if pa.types.is_timestamp(kind):
        return "timestamp" if kind.tz is not None else None
    if pa.types.is_large_list(kind):
        kind = pa.list_(kind.value_type)
    for name, arrow in ARROW_TYPES.items():
        if kind == arrow:
            return name
    return None


def _iceberg_type(kind: pa.DataType) -> str:
    simple = {
        pa.string(): "string",
        pa.large_string(): "string",
        pa.int32(): "int",
        pa.int64(): "long",
        pa.float32(): "float",
        pa.float64(): "double",
        pa.bool_(): "boolean",
        pa.date32(): "date",
        UTC_US: "timestamptz",
    }
    return simple.get(kind, str(kind))


@dataclass(frozen=True)
class ColumnPlan:
    """One column: its name and type in the file, in the table and as a pipeline Field."""

    name: str
    source: str
    source_type: str
    table_type: str
    field_type: str | None
    note: str = ""


@dataclass(frozen=True)
class LoadPlan:
    """What a load will write, known before writing."""

    table: str
    source: str
    columns: tuple[ColumnPlan, ...]
    schema: pa.Schema
    exists: bool
    mode: Mode
    hints: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    """Columns an append adds to the table (``--add-columns``)."""

    @property
    def action(self) -> str:
        if not self.exists:
            return f"create {self.table}"
        if self.mode != "append":
            return f"replace {self.table}"
        adding = f", adding column(s) {', '.join(self.added)}" if self.added else ""
        return f"append to {self.table}{adding}"


@dataclass(frozen=True)
class LoadReport:
    """What a load wrote."""

    table: str
    rows: int
    files: int
    snapshot_id: int | None
    truncated: dict[str, int] = field(default_factory=dict)
    """Per time column: values that lost sub-microsecond digits."""
    message: str = ""
    """What the format's finishing step recorded on the table (``Load.finish``), for the user."""


def _snake(name: str) -> str:
    snake = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()
    snake = re.sub(r"[^a-z0-9_]+", "_", snake).strip("_") or "column"
    return f"_{snake}" if snake[0].isdigit() else snake


def _widened(values: pa.Array) -> tuple[pa.Array, str]:
    """``values`` in a type Iceberg stores as it is, and what changed."""
    kind = values.type
    if pa.types.is_dictionary(kind):
        inner, note = _widened(values.dictionary_decode())
        return inner, note or "categories (dictionary) decoded"
    if pa.types.is_uint8(kind) or pa.types.is_uint16(kind):
        return values.cast(pa.int32()), ""
    if pa.types.is_uint32(kind) or pa.types.is_uint64(kind):
        return values.cast(pa.int64()), "" if pa.types.is_uint32(kind) else "unsigned -> long"
    if pa.types.is_float16(kind):
        return values.cast(pa.float32()), ""
    if pa.types.is_null(kind):
        return values.cast(pa.string()), "no values in the first rows: stored as string"
    return values, ""


class _Converter:
    """Turns the file's batches into the table's, remembering what it did for the plan."""

    def __init__(
        self, options: LoadOptions, source: str, names: list[str], time_text: frozenset[str]
    ) -> None:
        self.options = options
        self.time_columns = set(options.time_columns) | time_text
        self.source = source
        missing = [
            *(c for c in options.timestamp_columns if c not in names),
            *(c for c in options.types if c not in names),
            *(c for c in options.renames if c not in names),
        ]
        self.label = _LABEL.match(options.label) if options.label else None
        if self.label and self.label["column"] not in names:
            missing.append(self.label["column"])
        if missing:
            raise LoadError(
                f"{source} has no column {missing[0]!r}; its columns: {', '.join(names)}"
                f"{did_you_mean(missing[0], names)}"
            )
        finals = [options.renames.get(n, n) for n in names] + (["label"] if self.label else [])
        clash = sorted({n for n in finals if finals.count(n) > 1})
        if clash:
            raise LoadError(
                f"{source}: two columns would be called {clash[0]!r} in the table; "
                f"rename one with --rename {clash[0]}=OTHER"
            )
        self.names = names
        self.notes: dict[str, str] = {}
        self.truncated: dict[str, int] = {}

    def _column(self, name: str, values: pa.Array, first_row: int) -> pa.Array:
        kind = self.options.types.get(name)
        if name in self.time_columns or pa.types.is_timestamp(values.type):
            converted = to_utc(values, self.options.time, name, first_row)
            self.notes.setdefault(name, converted.note)
            if converted.truncated:
                self.truncated[name] = self.truncated.get(name, 0) + converted.truncated
            return converted.values
        if kind is not None:
            try:
                return values.cast(ARROW_TYPES[kind])
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise self._uncastable(name, kind, values, first_row) from exc
        widened, note = _widened(values)
        if note:
            self.notes.setdefault(name, note)
        return widened

    @staticmethod
    def _uncastable(name: str, kind: str, values: pa.Array, first_row: int) -> LoadError:
        for i, value in enumerate(values.to_pylist()):
            try:
                pa.array([value], values.type).cast(ARROW_TYPES[kind])
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return LoadError(
                    f"column {name!r}, row {first_row + i:,}: {value!r} is not a {kind} "
                    f"(--type {name}={kind}); fix the value or declare another type"
                )
        return LoadError(f"column {name!r} cannot be read as {kind} (--type {name}={kind})")

    def _label(self, label: re.Match[str], arrays: dict[str, pa.Array]) -> pa.Array:
        column, compare = label["column"], _COMPARE[label["op"]]
        try:
            return compare(arrays[column], float(label["value"])).cast(pa.int32())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise LoadError(
                f"--label {self.options.label!r}: column {column!r} is "
                f"{arrays[column].type}, not a number"
            ) from exc

    def __call__(self, batch: pa.RecordBatch, first_row: int) -> pa.RecordBatch:
        try:
            arrays = {n: self._column(n, batch.column(n), first_row) for n in self.names}
            if self.label:
                arrays["label"] = self._label(self.label, arrays)
                self.notes.setdefault("label", f"1 where {self.options.label}, else 0")
        except LoadError as exc:
            raise LoadError(f"{self.source}: {exc}") from exc
        return pa.RecordBatch.from_arrays(
            list(arrays.values()), names=[self.options.renames.get(n, n) for n in arrays]
        )


@dataclass
class Load:
    """An opened load: its plan and first rows known, nothing written yet. Close it."""

    plan: LoadPlan
    preview: pa.Table
    """The first converted rows."""
    catalog: Catalog
    input: Input
    _rest: Iterator[pa.RecordBatch]
    _truncated: Callable[[], dict[str, int]]
    file_rows: int
    finish: Finish | None = None

    def close(self) -> None:
        self.input.close()

    def __enter__(self) -> Load:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def write(self, progress: Progress = _quiet) -> LoadReport:
        """Every row into the table, in one transaction (see the module's docstring)."""
        return write_table(self, progress)


def _conform(rows: pa.Table, target: pa.Schema, table: str) -> pa.Table:
    """``rows`` in an existing table's schema, or a LoadError naming the columns that differ."""
    extra = [n for n in rows.column_names if n not in target.names]
    lacking = [n for n in target.names if n not in rows.column_names]
    if extra or lacking:
        parts = []
        if extra:
            parts.append(
                f"the table has no column(s) {', '.join(extra)} (--add-columns adds them; the "
                "rows already in it read null there)"
            )
        if lacking:
            parts.append(f"the file has no column(s) {', '.join(lacking)}")
        raise LoadError(
            f"cannot append to {table}: {'; '.join(parts)}; rename columns with --rename, or "
            "pass --replace to replace the table with the file's columns"
        )
    try:
        return rows.select(target.names).cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise LoadError(
            f"cannot append to {table}: a column's type differs from the table's ({exc}); "
            "declare it with --type, or pass --replace"
        ) from exc


def _gathered(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.Table]:
    pending: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        pending.append(batch)
        count += batch.num_rows
        if count >= rows:
            yield pa.Table.from_batches(pending)
            pending, count = [], 0
    if pending:
        yield pa.Table.from_batches(pending)


class _RecordedIO(FileIO):
    """A table's FileIO that notes every file written through it, so that a load which fails
    deletes what it wrote: pyiceberg writes data files and manifests as rows are appended,
    before the commit, and a file no snapshot names is never read but never removed either."""

    def __init__(self, io: FileIO) -> None:
        super().__init__(io.properties)
        self._io = io
        self.written: list[str] = []

    def new_input(self, location: str) -> InputFile:
        return self._io.new_input(location)

    def new_output(self, location: str) -> OutputFile:
        self.written.append(location)
        return self._io.new_output(location)

    def delete(self, location: str | InputFile | OutputFile) -> None:
        self._io.delete(location)

    def delete_written(self) -> None:
        for location in reversed(self.written):
            with contextlib.suppress(OSError):  # what was never made, or is gone already
                self._io.delete(location)


def _recorded(tx: Transaction) -> _RecordedIO:
    """``tx``'s table writing through a :class:`_RecordedIO`."""
    # The transaction writes through its table's io; a CreateTableTransaction's table is only
    # reachable as tx._table.
    table = tx._table
    recorded = _RecordedIO(table.io)
    table.io = recorded
    return recorded


def _add_columns(tx: Transaction, plan: LoadPlan) -> pa.Schema:
    """The table's schema in ``tx`` with the plan's new columns added (optional: the rows
    already in it read null there)."""
    with tx.update_schema() as update:
        update.union_by_name(pa.schema([plan.schema.field(n) for n in plan.added]))
    return tx.table_metadata.schema().as_arrow()


def _append_all(
    tx: Transaction, load: Load, target: pa.Schema | None, progress: Progress
) -> tuple[int, int]:
    """Every row of ``load`` appended in ``tx``, in files of ``load.file_rows``: (rows, files)."""
    plan = load.plan
    rows = files = 0
    for chunk in _gathered(load._rest, load.file_rows):
        chunk = chunk.cast(plan.schema) if target is None else _conform(chunk, target, plan.table)
        tx.append(chunk)
        rows += chunk.num_rows
        files += 1
        progress(rows, load.input.done(), load.input.total)
    return rows, files


def write_table(load: Load, progress: Progress = _quiet) -> LoadReport:
    """Write an opened load (see :class:`Load`); one that fails deletes the files it wrote."""
    plan, catalog = load.plan, load.catalog
    namespace, _ = check_table_name(plan.table)
    catalog.create_namespace_if_not_exists(namespace)
    exists = catalog.table_exists(plan.table)
    if exists and plan.mode == "create":
        raise LoadError(
            f"table {plan.table} exists; pass --append to add these rows to it or --replace to "
            "replace it"
        )
    target: pa.Schema | None = None
    tx: Transaction
    if exists and plan.mode == "append":
        table = catalog.load_table(plan.table)
        target = table.schema().as_arrow()
        tx = table.transaction()
    else:
        tx = catalog.create_table_transaction(plan.table, schema=plan.schema)
    written = _recorded(tx)
    try:
        if target is not None and plan.added:
            target = _add_columns(tx, plan)
        rows, files = _append_all(tx, load, target, progress)
        message = ""
        if load.finish is not None:
            properties, message = load.finish(rows)
            if properties:
                tx.set_properties(dict(properties))
        if exists and plan.mode == "replace":
            # Dropped only now, so that a load which failed above left the old table in place.
            catalog.drop_table(plan.table)
        tx.commit_transaction()
    except BaseException:
        written.delete_written()
        raise
    snapshot = catalog.load_table(plan.table).current_snapshot()
    return LoadReport(
        plan.table,
        rows,
        files,
        snapshot.snapshot_id if snapshot else None,
        load._truncated(),
        message,
    )


def open_load(
    stack: StackConfig,
    source: str,
    batches: Iterator[pa.RecordBatch],
    convert: Callable[[pa.RecordBatch, int], pa.RecordBatch],
    *,
    opened: Input,
    table: str,
    mode: Mode,
    notes: Callable[[], Mapping[str, str]],
    truncated: Callable[[], dict[str, int]] = dict,
    file_rows: int = 1_000_000,
    preview_rows: int = 5,
    add_columns: bool = False,
    finish: Finish | None = None,
) -> Load:
    """A load of ``batches`` converted by ``convert``: the first batch is read and converted
    now, for the plan. ``flow import`` formats use this with converters of their own."""
    first = next(batches, None)
    if first is None:
        opened.close()
        raise LoadError(f"{source} has no rows; nothing to load")
    source_schema = first.schema
    converted = convert(first, 1)
    schema = pa.schema([pa.field(f.name, f.type) for f in converted.schema])
    catalog = open_catalog(stack.catalog)
    exists = catalog.table_exists(table)
    added: tuple[str, ...] = ()
    if exists and mode == "append":
        target = catalog.load_table(table).schema().as_arrow()
        if add_columns:
            added = tuple(n for n in schema.names if n not in target.names)
        target = pa.schema([*target, *(schema.field(n) for n in added)])
        _conform(pa.Table.from_batches([converted]), target, table)
    found = notes()
    columns = []
    for i, f in enumerate(schema):
        # Converters keep the file's columns in order and add theirs after them.
        origin = source_schema.field(i) if i < len(source_schema) else None
        columns.append(
            ColumnPlan(
                name=f.name,
                source=origin.name if origin is not None else "(made)",
                source_type=str(origin.type) if origin is not None else "",
                table_type=_iceberg_type(f.type),
                field_type=field_type(f.type),
                note=found.get(origin.name if origin is not None else f.name, ""),
            )
        )
    hints = tuple(
        f"column {c.name!r} cannot be named by a pipeline Field (lowercase letters, digits, _): "
        f"load it with --rename '{c.source}={_snake(c.name)}'"
        for c in columns
        if not _FIELD_NAME.match(c.name)
    )
    plan = LoadPlan(table, source, tuple(columns), schema, exists, mode, hints, added)

    def rest() -> Iterator[pa.RecordBatch]:
        yield converted
        row = 1 + first.num_rows
        for batch in batches:
            yield convert(batch, row)
            row += batch.num_rows

    preview = pa.Table.from_batches([converted.slice(0, preview_rows)])
    return Load(plan, preview, catalog, opened, rest(), truncated, file_rows, finish)


def _read_types(options: LoadOptions, fmt: Format) -> dict[str, pa.DataType]:
    """The types the CSV reader is told: time columns as text (parsed and checked here), the
    declared types as they are (so a later block cannot disagree with the first)."""
    if fmt != "csv":
        return {}
    types = {n: ARROW_TYPES[k] for n, k in options.types.items() if k != "timestamp"}
    types.update({n: pa.string() for n in options.time_columns})
    return types


def load_file(stack: StackConfig, path: Path, options: LoadOptions) -> Load:
    """Open ``path`` for loading into ``options.table``: read its first rows and plan."""
    fmt = options.format or detect_format(path)
    opened = open_input(
        path,
        fmt,
        delimiter=options.delimiter,
        types=_read_types(options, fmt),
        block_bytes=options.block_bytes,
    )
    batches = opened.batches
    first = next(batches, None)
    if first is None:
        opened.close()
        raise LoadError(f"{path} has no rows; nothing to load")
    try:
        convert = _Converter(options, str(path), first.schema.names, opened.time_text)

        def all_batches() -> Iterator[pa.RecordBatch]:
            yield first
            yield from batches

        return open_load(
            stack,
            str(path),
            all_batches(),
            convert,
            opened=opened,
            table=options.table,
            mode=options.mode,
            notes=lambda: {**opened.notes, **convert.notes},
            truncated=lambda: dict(convert.truncated),
            file_rows=options.file_rows,
            add_columns=options.add_columns,
        )
    except BaseException:
        opened.close()
        raise
