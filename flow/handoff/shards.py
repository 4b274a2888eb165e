"""Shard files: Arrow IPC with LZ4/ZSTD buffers (or none), checksummed."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from pyarrow import fs as pafs

from flow.errors import HandoffError, ShardCorruptError
from flow.handoff.format import ShardInfo
from flow.storage import Location

__all__ = ["codec", "fixed_size_lists", "read_shard", "write_shard"]

COMPRESSIONS = (None, "lz4", "zstd")
#: LZ4 at acceleration 2 (level -1) rather than 1: on Criteo-shaped rows it writes with ~30 %
#: less CPU, files the same size, decoded as fast (LZ4 frames need no level to decode).
_LEVELS = {"lz4": -1}


def codec(compression: str | None, level: int | None = None) -> pa.Codec | None:
    """The codec shards are written with; a bad name or level names what to use instead.

    LZ4 levels below 0 are accelerations (-8: ~40 % less CPU to write and ~25 % less to read
    than the default -1, for ~18 % more bytes on Criteo-shaped rows); 0-2 are LZ4's default
    and 3-12 its much slower high-compression mode. ZSTD's negative levels are its fast ones.
    """
    if compression not in COMPRESSIONS:
        raise HandoffError(f"compression {compression!r} is unknown; use one of {COMPRESSIONS}")
    if compression is None:
        if level is not None:
            raise HandoffError(f"compression_level={level} needs a compression (lz4 or zstd)")
        return None
    chosen = level if level is not None else _LEVELS.get(compression)
    if chosen is None:
        return pa.Codec(compression)
    # Arrow reports 1 as LZ4's lowest level, but passes negative ones on as LZ4's accelerations.
    lowest = -65537 if compression == "lz4" else pa.Codec.minimum_compression_level(compression)
    highest = pa.Codec.maximum_compression_level(compression)
    if not lowest <= chosen <= highest:
        raise HandoffError(
            f"compression_level={chosen} is out of range for {compression}: use {lowest}..{highest}"
            " (lower is faster and bigger)"
        )
    return pa.Codec(compression, compression_level=chosen)


def fixed_size_lists(table: pa.Table, sizes: dict[str, int]) -> pa.Table:
    """``list`` columns named in ``sizes`` as ``fixed_size_list`` of that size.

    A fixed-size list is one contiguous values buffer: the reader hands a whole feature block
    (rows x width) to numpy and torch without a copy per column or per row.
    """
    for name, size in sizes.items():
        if name not in table.column_names:
            continue
        chunks = table.column(name)
        # One chunk (a Spark batch) is used as it is: combine_chunks() would copy it.
        column = chunks.chunk(0) if chunks.num_chunks == 1 else chunks.combine_chunks()
        if pa.types.is_fixed_size_list(column.type):
            continue
        if column.null_count:
            raise HandoffError(f"column {name!r} has null lists; a feature block cannot be null")
        lengths = pc.list_value_length(column)
        if len(column) and (pc.min(lengths).as_py() != size or pc.max(lengths).as_py() != size):
            raise HandoffError(
                f"column {name!r} has lists of {pc.min(lengths).as_py()}..{pc.max(lengths).as_py()}"
                f" values; every row must have {size}"
            )
        fixed = pa.FixedSizeListArray.from_arrays(column.flatten(), size)
        table = table.set_column(table.schema.get_field_index(name), name, fixed)
    return table


def write_shard(
    folder: Location,
    name: str,
    table: pa.Table,
    compression: str | None,
    bucket: int,
    level: int | None = None,
) -> ShardInfo:
    """Write ``table`` as one IPC file ``name`` under ``folder``; its ShardInfo."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=codec(compression, level))
    with pa.ipc.new_file(sink, table.schema, options=options) as writer:
        writer.write_table(table, max_chunksize=max(1, table.num_rows))
    data = sink.getvalue()
    folder.write_bytes(name, data)
    return ShardInfo(
        path=name,
        bucket=bucket,
        rows=table.num_rows,
        bytes=data.size,
        checksum=xxhash.xxh3_64_hexdigest(memoryview(data)),
    )


#: Decoding on Arrow's own thread pool as well as on the reader's prefetch threads cost more
#: than it saved: a 1.6k-row shard took 364 us to decode with it, 224 us without.
_IPC_READ = pa.ipc.IpcReadOptions(use_threads=False)


def read_shard(
    channel: Location,
    info: ShardInfo,
    *,
    verify: bool = True,
    commit: int = -1,
    map_file: bool = False,
    check_rows: bool = True,
) -> pa.Table:
    """The shard's rows. A missing, truncated or corrupted file raises ShardCorruptError naming
    its path, and so does one with another row count than its commit records (``check_rows``:
    a commit record edited after the fact would otherwise have rows read twice or not at all).

    ``map_file`` memory-maps a file on local disk instead of reading it: worth it only for
    uncompressed shards, whose buffers are then used in place. Compressed shards are read, since
    their bytes are decoded into new buffers anyway, and mapping many files from two threads
    serializes them in the kernel (mmap and page faults share a lock): two threads decoded
    small shards no faster than one when they were mapped, 1.7x faster when they were read.
    """
    path = f"{channel.path}/{info.path}"
    where = f"{channel.uri}/{info.path}"
    try:
        if map_file and isinstance(channel.fs, pafs.LocalFileSystem):
            buffer = pa.memory_map(path, "r").read_buffer()
        else:
            with channel.fs.open_input_file(path) as source:
                buffer = source.read_buffer()
    except (FileNotFoundError, OSError) as exc:
        raise ShardCorruptError(f"shard {where} (batch {commit}) cannot be read: {exc}") from exc
    if buffer.size != info.bytes:
        raise ShardCorruptError(
            f"shard {where} (batch {commit}) is {buffer.size} bytes, its commit says {info.bytes}: "
            "the file is truncated or was replaced"
        )
    if verify and xxhash.xxh3_64_hexdigest(memoryview(buffer)) != info.checksum:
        raise ShardCorruptError(
            f"shard {where} (batch {commit}) does not match its checksum: the file is corrupt"
        )
    try:
        table = pa.ipc.open_file(pa.BufferReader(buffer), options=_IPC_READ).read_all()
    except pa.ArrowInvalid as exc:
        raise ShardCorruptError(
            f"shard {where} (batch {commit}) is not a valid Arrow file: {exc}"
        ) from exc
    if check_rows and table.num_rows != info.rows:
        raise ShardCorruptError(
            f"shard {where} (batch {commit}) holds {table.num_rows:,} rows, its commit records "
            f"{info.rows:,}: the commit record was edited or damaged"
        )
    return table
