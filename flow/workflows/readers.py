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


def _position(raw: io.BufferedReader, size: int) -> Callable[[], int]:
    # The reader closes a compressed stream's file when it reaches the end.
    return lambda: size if raw.closed else raw.tell()


def _failing(
    path: Path, batches: Iterator[pa.RecordBatch], hint: str = _TYPE_HINT
) -> Iterator[pa.RecordBatch]:
    """``batches``, with the readers' conversion errors (a column typed from the first block
    that later holds something else) as LoadErrors that say what to change."""
    rows = 0
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise LoadError(f"{path}: after row {rows:,}: {exc}. {hint}") from exc
        rows += batch.num_rows
        yield batch


def open_csv(
    path: Path,
    parse: pcsv.ParseOptions,
    convert: pcsv.ConvertOptions,
    *,
    column_names: list[str] | None = None,
    block_bytes: int = 4 << 20,
    hint: str = _TYPE_HINT,
) -> Input:
    """A delimited text file as record batches (``column_names``: it has no header)."""
    raw, stream = _stream(path)
    try:
        reader = pcsv.open_csv(
            stream,
            read_options=pcsv.ReadOptions(block_size=block_bytes, column_names=column_names),
            parse_options=parse,
            convert_options=convert,
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raw.close()
        raise LoadError(f"{path}: cannot read it ({exc}). {hint}") from exc
    size = path.stat().st_size
    return Input(_failing(path, iter(reader), hint), _position(raw, size), size, "bytes", raw.close)


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
