"""Handoff batches as torch tensors: a zero-copy view of the Arrow buffers where possible.

A feature block stored as a fixed-size list (``dense``, ``sparse``, ``seq_*``) is one values
buffer: it becomes a ``[batch, width]`` tensor over that buffer, no copy. Numbers become 1-D
tensors the same way; timestamps become int64 microseconds. Strings are left out (a trainer has
no use for them).

Columns read for metrics only (event and production times, an oracle's probabilities) may have
nulls, which a tensor view cannot say: :func:`timestamps_us` and :func:`probabilities` copy them
into numpy arrays with a marker for a null (``NO_TIME``, NaN).

The tensors are read-only views of memory the reader owns until the next batch: a trainer moves
them to the GPU (or copies them) before asking for another.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import IterableDataset, get_worker_info

from flow.errors import ConfigError
from flow.handoff.rowid import bytes_hashes, mix

__all__ = [
    "NO_KEY",
    "NO_TIME",
    "HandoffDataset",
    "key_hashes",
    "pack_columns",
    "probabilities",
    "timestamps_us",
    "to_tensors",
]

NO_TIME = np.iinfo(np.int64).min
"""What :func:`timestamps_us` gives for a null timestamp."""

NO_KEY = np.iinfo(np.int64).min
"""What :func:`key_hashes` gives for a null key (no hash takes this value)."""


class _Reader(Protocol):
    def __iter__(self) -> Iterator[pa.RecordBatch]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


_warned = False


def _tensor(values: np.ndarray) -> torch.Tensor:
    # Arrow buffers are read-only and torch warns at its first view of one; the view is the
    # point. Torch warns only once per process, so only that first view needs the (not free)
    # warnings context.
    global _warned
    if _warned or values.flags.writeable:
        return torch.from_numpy(values)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensor = torch.from_numpy(values)
    _warned = True
    return tensor


def _column(array: pa.Array) -> np.ndarray | None:
    """A numpy view of the column's buffer, or None when it has no tensor form."""
    kind = array.type
    values: np.ndarray | None = None
    if pa.types.is_fixed_size_list(kind):
        flat = array.flatten()
        if not array.null_count and not flat.null_count:
            values = flat.to_numpy(zero_copy_only=True).reshape(len(array), kind.list_size)
    elif pa.types.is_timestamp(kind):
        values = array.cast(pa.int64()).to_numpy(zero_copy_only=array.null_count == 0)
    elif (pa.types.is_integer(kind) or pa.types.is_floating(kind)) and not array.null_count:
        values = array.to_numpy(zero_copy_only=True)
    return values


def timestamps_us(array: pa.Array | pa.ChunkedArray, name: str) -> np.ndarray:
    """A timestamp column as int64 microseconds since the epoch, ``NO_TIME`` where null (backfill
    rows have no production time, for one), whatever the column's unit."""
    if not pa.types.is_timestamp(array.type):
        raise ConfigError(
            f"column {name!r} is {array.type}, not a timestamp; name a timestamp column "
            "(--event-time, --produced-time)"
        )
    micros = array.cast(pa.timestamp("us", tz=array.type.tz)).cast(pa.int64())
    values: np.ndarray = micros.fill_null(NO_TIME).to_numpy()
    return values


def probabilities(array: pa.Array | pa.ChunkedArray, name: str) -> np.ndarray:
    """A column of probabilities as float64, NaN where null; a value outside [0, 1] or a
    column of another kind is an error naming the column."""
    if not (pa.types.is_floating(array.type) or pa.types.is_integer(array.type)):
        raise ConfigError(
            f"--oracle {name!r}: the column is {array.type}; name a column of click "
            "probabilities in [0, 1]"
        )
    values: np.ndarray = array.cast(pa.float64()).fill_null(np.nan).to_numpy()
    outside = np.count_nonzero((values < 0) | (values > 1))
    if outside:
        raise ConfigError(
            f"--oracle {name!r}: {outside} of {len(values)} values lie outside [0, 1]; name a "
            "column of click probabilities"
        )
    return values


def key_hashes(array: pa.Array | pa.ChunkedArray, name: str) -> np.ndarray:
    """A key column (integers or strings) as int64 hashes, the same for the same key in any
    batch or process, ``NO_KEY`` where null: how the metrics match an impression's rows."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    kind = array.type
    if pa.types.is_integer(kind):
        hashed = mix(array.cast(pa.int64()).fill_null(0).to_numpy().view(np.uint64))
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind):
        hashed = bytes_hashes(array)
    else:
        raise ConfigError(
            f"key column {name!r} is {kind}; a label key is a string or an integer column"
        )
    values = hashed.view(np.int64)
    values[values == NO_KEY] = NO_KEY + 1
    if array.null_count:
        values[np.asarray(array.is_null())] = NO_KEY
    return values


def to_tensors(
    batch: pa.RecordBatch, columns: Sequence[str] | None = None
) -> dict[str, torch.Tensor]:
    """The batch's numeric columns and feature blocks as tensors (zero-copy views)."""
    out = {}
    for name in columns or batch.schema.names:
        values = _column(batch.column(name))
        if values is not None:
            out[name] = _tensor(values)
        elif columns is not None:
            raise TypeError(
                f"column {name!r} ({batch.schema.field(name).type}) has nulls or no tensor form"
            )
    return out


def pack_columns(
    table: pa.Table, columns: Sequence[str], *, pin: bool = False
) -> dict[str, torch.Tensor]:
    """Each column of a chunked ``table`` as one contiguous tensor, the chunks copied in order.

    With ``pin`` the tensors are in page-locked memory, which a GPU copies from without a
    staging copy of its own (and asynchronously). Each chunk is one sequential copy: the point
    is to replace a random gather on the host with copies that run at memory speed.
    """
    out = {}
    for name in columns:
        views = [_column(chunk) for chunk in table.column(name).chunks if len(chunk)]
        if not views or any(v is None for v in views):
            raise TypeError(
                f"column {name!r} ({table.schema.field(name).type}) has nulls or no tensor form"
            )
        parts = [_tensor(v) for v in views if v is not None]
        target = torch.empty(
            (table.num_rows, *parts[0].shape[1:]), dtype=parts[0].dtype, pin_memory=pin
        )
        position = 0
        for part in parts:
            target[position : position + len(part)].copy_(part)
            position += len(part)
        out[name] = target
    return out


class HandoffDataset(IterableDataset[dict[str, torch.Tensor]]):
    """A reader's batches as dicts of tensors, for ``DataLoader(dataset, batch_size=None)``.

    The reader already forms, shuffles and balances batches: give the DataLoader
    ``batch_size=None`` and no workers. Worker processes are refused: each would get a copy of
    the reader and read the rank's whole share again (every row ``num_workers`` times), and the
    cursor of the copies would never reach a checkpoint. The reader decodes on threads of its
    own instead (``ReadOptions.threads``). Its cursor is the reader's: ``state_dict()`` goes into
    a checkpoint, ``load_state_dict()`` continues from it.
    """

    def __init__(
        self,
        reader: _Reader,
        columns: Sequence[str] | None = None,
        transform: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
    ) -> None:
        self.reader = reader
        self.columns = list(columns) if columns is not None else None
        self.transform = transform

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        worker = get_worker_info()
        if worker is not None:
            raise ConfigError(
                f"HandoffDataset runs in the training process, not in DataLoader worker "
                f"{worker.id} of {worker.num_workers}: each worker would read every row again. "
                "Use DataLoader(dataset, batch_size=None, num_workers=0); for more decoding "
                "threads set ReadOptions(threads=N)"
            )
        for batch in self.reader:
            tensors = to_tensors(batch, self.columns)
            yield self.transform(tensors) if self.transform else tensors

    def state_dict(self) -> dict[str, Any]:
        return self.reader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reader.load_state_dict(state)
