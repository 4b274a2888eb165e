"""Reading a user's file as a stream of Arrow record batches, so it never has to fit in memory.

CSV and JSON lines are read a block at a time (pyarrow's streaming readers; a ``.gz``/``.bz2``/
``.zst`` suffix is decompressed on the fly) and Parquet a batch at a time (``pyarrow.dataset``,
a file or a folder of files). Each input says how far it has got, in bytes of the file or in
rows, for a progress bar.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.dataset as pds
import pyarrow.json as pjson

from flow.errors import ConfigError, LoadError

__all__ = ["FORMATS", "Format", "Input", "detect_format", "open_csv", "open_input"]

Format = Literal["csv", "parquet", "json"]
FORMATS: tuple[Format, ...] = ("csv", "parquet", "json")
_COMPRESSION = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}
_SUFFIXES: dict[str, Format] = {
    ".csv": "csv",
    ".tsv": "csv",
    ".txt": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
}
_BATCH_ROWS = 64 * 1024


@dataclass
class Input:
    """A file as record batches, with how far reading has got (``done`` of ``total`` units)."""

    batches: Iterator[pa.RecordBatch]
    done: Callable[[], int]
    total: int | None
    unit: Literal["bytes", "rows"]
    close: Callable[[], None] = field(default=lambda: None)
    time_text: frozenset[str] = frozenset()
    """Columns read as text because the reader took them for times (parse them as times)."""
    notes: Mapping[str, str] = field(default_factory=dict)
    """Per column: how the reader chose to read it, when it is not what it would have been."""


def detect_format(path: Path) -> Format:
    """The format a file's name says (``ratings.csv.gz``: csv), or a ConfigError."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in _COMPRESSION:
        suffixes.pop()
    if path.is_dir():
        return "parquet"
    if suffixes and suffixes[-1] in _SUFFIXES:
        return _SUFFIXES[suffixes[-1]]
    raise ConfigError(
        f"cannot tell the format of {path} from its name; pass --format {'|'.join(FORMATS)}"
    )


def _stream(path: Path) -> tuple[io.BufferedReader, pa.NativeFile | io.BufferedReader]:
    """The raw file (whose position is the progress) and what to read from it."""
    raw = open(path, "rb")  # noqa: SIM115 - closed by Input.close
    compression = _COMPRESSION.get(path.suffix.lower())
    if compression is None:
        return raw, raw
    return raw, pa.CompressedInputStream(pa.PythonFile(raw, mode="r"), compression)


_TYPE_HINT = (
    "Column types are taken from the first rows; declare the column's type with --type "
    "NAME=string (or long, double, timestamp, ...)"
)


_FIELDS_HINT = (
    "Every line needs as many fields as the first; fix the line, or check the separator "
    "(--delimiter) and the quoting"
)


def _position(raw: io.BufferedReader, size: int) -> Callable[[], int]:
    # The reader closes a compressed stream's file when it reaches the end.
    return lambda: size if raw.closed else raw.tell()


class _BadRows:
    """A CSV reader's invalid-row handler that keeps the row pyarrow refused, so that the error
    can name its line: the streaming reader does not know line numbers (``InvalidRow.number``
    is None), only the text of the row."""

    def __init__(self) -> None:
        self.text: str | None = None

    def __call__(self, row: pcsv.InvalidRow) -> str:
        self.text = row.text
        return "error"


def _line_of(path: Path, text: str, first: int) -> int | None:
    """The number (from 1) of the first line at or after line ``first`` that reads ``text``.

    Only run on the way to an error: it reads the file again, up to that line. A line holds at
    most one row, so a row that follows ``first - 1`` rows is on line ``first`` or later."""
    wanted = text.encode().rstrip(b"\r\n")
    raw, stream = _stream(path)
    try:
        reader = io.BufferedReader(stream) if isinstance(stream, pa.NativeFile) else stream
        for number, line in enumerate(reader, start=1):
            if number >= first and line.rstrip(b"\r\n") == wanted:
                return number
    finally:
        raw.close()
    return None


def _parse_error(
    path: Path, exc: pa.ArrowException, bad: _BadRows, rows: int, header: int, hint: str
) -> LoadError:
    """The reader's error as a LoadError naming the file's line, when pyarrow refused a row
    (too few or too many fields), else the rows read before the block that failed."""
    if bad.text is not None:
        found = _line_of(path, bad.text, rows + header + 1)
        where = f"line {found:,}" if found is not None else f"after row {rows:,}"
        # pyarrow: "CSV parse error: Expected 40 columns, got 38: <the row>"
        why = str(exc).removeprefix("CSV parse error: ").split(": ", 1)[0]
        fix = _FIELDS_HINT if hint is _TYPE_HINT else hint
        return LoadError(f"{path}: {where}: {why} ({bad.text[:80]!r}). {fix}")
    return LoadError(f"{path}: after row {rows:,}: {exc}. {hint}")


def _failing(
    path: Path,
    batches: Iterator[pa.RecordBatch],
    hint: str = _TYPE_HINT,
    bad: _BadRows | None = None,
    header: int = 0,
) -> Iterator[pa.RecordBatch]:
    """``batches``, with the readers' errors (a column typed from the first block that later
    holds something else, a CSV line with too few fields) as LoadErrors that say where and
    what to change."""
    rows = 0
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise _parse_error(path, exc, bad or _BadRows(), rows, header, hint) from exc
        rows += batch.num_rows
        yield batch


_INTEGER_TEXT = r"^\s*[+-]?\d+\s*$"
_WIDE_NOTE = (
    "integers wider than a long (20 digits): read as text, exact; --type {name}=double reads "
    "them as rounded numbers"
)


def _with_handler(parse: pcsv.ParseOptions, bad: _BadRows) -> pcsv.ParseOptions:
    return pcsv.ParseOptions(
        delimiter=parse.delimiter,
        quote_char=parse.quote_char,
        double_quote=parse.double_quote,
        escape_char=parse.escape_char,
        newlines_in_values=parse.newlines_in_values,
        ignore_empty_lines=parse.ignore_empty_lines,
        invalid_row_handler=bad,
    )


def _wide_integers(
    path: Path, parse: pcsv.ParseOptions, read: pcsv.ReadOptions, doubles: list[str]
) -> list[str]:
    """The columns among ``doubles`` (typed double from the first block) whose values there are
    all integers: pyarrow reads an integer as double when it is wider than a long (an id of 20
    digits), which keeps only its first ~16 digits. Found by reading the block again as text."""
    raw, stream = _stream(path)
    try:
        reader = pcsv.open_csv(
            stream,
            read_options=read,
            parse_options=parse,
            convert_options=pcsv.ConvertOptions(
                column_types=dict.fromkeys(doubles, pa.string()),
                include_columns=doubles,
                strings_can_be_null=True,
            ),
        )
        first = reader.read_next_batch()
    except (pa.ArrowInvalid, pa.ArrowTypeError, StopIteration):
        return []  # the real read reports it
    finally:
        raw.close()
    wide = []
    for name in doubles:
        values = first.column(name).drop_null()
        if len(values) and pc.all(pc.match_substring_regex(values, _INTEGER_TEXT)).as_py():
            wide.append(name)
    return wide


def open_csv(
    path: Path,
    parse: pcsv.ParseOptions,
    convert: pcsv.ConvertOptions,
    *,
    column_names: list[str] | None = None,
    block_bytes: int = 4 << 20,
    hint: str = _TYPE_HINT,
) -> Input:
    """A delimited text file as record batches (``column_names``: it has no header).

    A row pyarrow refuses (too few or too many fields) is an error naming its line. A column of
    integers too wide for a long, which pyarrow would read as (rounded) doubles, is read as text
    instead, with a note (:attr:`Input.notes`)."""
    bad = _BadRows()
    parse = _with_handler(parse, bad)
    read = pcsv.ReadOptions(block_size=block_bytes, column_names=column_names)
    header = 0 if column_names else 1

    def opened() -> tuple[io.BufferedReader, pcsv.CSVStreamingReader]:
        raw, stream = _stream(path)
        try:
            return raw, pcsv.open_csv(
                stream, read_options=read, parse_options=parse, convert_options=convert
            )
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raw.close()
            if bad.text is not None:
                raise _parse_error(path, exc, bad, 0, header, hint) from exc
            raise LoadError(f"{path}: cannot read it ({exc}). {hint}") from exc

    raw, reader = opened()
    declared = convert.column_types or {}
    doubles = [
        f.name for f in reader.schema if pa.types.is_float64(f.type) and f.name not in declared
    ]
    wide = _wide_integers(path, parse, read, doubles) if doubles else []
    if wide:
        raw.close()
        convert = pcsv.ConvertOptions(
            column_types={**declared, **dict.fromkeys(wide, pa.string())},
            null_values=convert.null_values,
            true_values=convert.true_values,
            false_values=convert.false_values,
            strings_can_be_null=convert.strings_can_be_null,
            quoted_strings_can_be_null=convert.quoted_strings_can_be_null,
            timestamp_parsers=convert.timestamp_parsers,
        )
        raw, reader = opened()
    size = path.stat().st_size
    return Input(
        _failing(path, iter(reader), hint, bad, header),
        _position(raw, size),
        size,
        "bytes",
        raw.close,
        notes={name: _WIDE_NOTE.format(name=name) for name in wide},
    )


def _csv(path: Path, delimiter: str, types: Mapping[str, pa.DataType], block_bytes: int) -> Input:
    return open_csv(
        path,
        pcsv.ParseOptions(delimiter=delimiter),
        pcsv.ConvertOptions(column_types=dict(types), strings_can_be_null=True),
        block_bytes=block_bytes,
    )


def _json(path: Path, block_bytes: int) -> Input:
    def reader(schema: pa.Schema | None) -> tuple[io.BufferedReader, pjson.JSONStreamingReader]:
        raw, stream = _stream(path)
        try:
            return raw, pjson.open_json(
                stream,
                read_options=pjson.ReadOptions(block_size=block_bytes),
                parse_options=pjson.ParseOptions(explicit_schema=schema),
            )
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raw.close()
            raise LoadError(f"{path}: cannot read it as JSON lines ({exc})") from exc

    # pyarrow turns an ISO string with a zone offset into a timezone-less UTC time, which the
    # --timezone rule would then shift again: time-like strings are read as text instead and
    # parsed by flow.workflows.timestamps, which keeps the offset.
    raw, first = reader(None)
    order = first.schema.names
    inferred = {f.name for f in first.schema if pa.types.is_timestamp(f.type)}
    if inferred:
        raw.close()
        raw, first = reader(pa.schema([(name, pa.string()) for name in sorted(inferred)]))

    def ordered() -> Iterator[pa.RecordBatch]:
        for batch in first:
            yield batch.select(order)

    return Input(
        _failing(path, ordered()),
        _position(raw, path.stat().st_size),
        path.stat().st_size,
        "bytes",
        raw.close,
        frozenset(inferred),
    )


def _parquet(path: Path) -> Input:
    try:
        dataset = pds.dataset(path, format="parquet")
        total = dataset.count_rows()
    except (pa.ArrowInvalid, OSError) as exc:
        raise LoadError(f"{path}: cannot read it as Parquet ({exc}); check --format") from exc
    rows = 0

    def batches() -> Iterator[pa.RecordBatch]:
        nonlocal rows
        for batch in dataset.to_batches(batch_size=_BATCH_ROWS):
            rows += batch.num_rows
            yield batch

    return Input(batches(), lambda: rows, total, "rows")


def open_input(
    path: Path,
    fmt: Format,
    *,
    delimiter: str | None = None,
    types: Mapping[str, pa.DataType] | None = None,
    block_bytes: int = 4 << 20,
) -> Input:
    """``path`` as record batches. ``types`` fixes the type of named CSV columns (the time
    columns are read as text, so that a bad value can be named); JSON reads time-like strings
    as text; JSON and Parquet columns are cast afterwards, by the caller."""
    if not path.exists():
        raise ConfigError(f"{path} does not exist; give the path of a CSV, Parquet or JSON file")
    if fmt == "csv":
        default = "\t" if ".tsv" in [s.lower() for s in path.suffixes] else ","
        return _csv(path, delimiter or default, types or {}, block_bytes)
    if fmt == "json":
        return _json(path, block_bytes)
    return _parquet(path)
