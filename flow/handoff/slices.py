"""Batches as ranges of a shuffle window, for consumers that gather rows themselves.

The reader's shuffle is a gather: a window's rows are taken in a permuted order and cut into
batches. On the host that gather is random access over the whole window (~137 ns a row on the
machines measured, the reader's largest cost), while a GPU does it as fast as it reads its
memory. :meth:`ChannelReader.slices() <flow.handoff.ChannelReader.slices>` therefore hands out
the window *unpermuted* (:class:`WindowRows`: zero-copy slices of the shards, the rows carried
from the previous window first) with its permutation, and each batch as a range of that
permutation (:class:`WindowSlice`). A trainer copies the window to the device in order, once,
and gathers each batch there; :meth:`WindowSlice.to_batch` gathers on the host instead and
gives exactly the record batch the reader's own iteration gives.

This module is engine-neutral (no torch): the device side lives in ``trainers.loader``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

__all__ = ["WindowRows", "WindowSlice", "one_batch"]


def one_batch(table: pa.Table) -> pa.RecordBatch:
    """``table``'s rows as one record batch: a view if they lie in one chunk, else a copy."""
    batches = [b for b in table.to_batches() if b.num_rows]
    if len(batches) == 1:
        return batches[0]
    return table.combine_chunks().to_batches()[0]


@dataclass(eq=False)
class WindowRows:
    """A shuffle window's rows in the order they were read, and the order they are used in.

    Row ``order[i]`` of ``table`` is the window's ``i``-th row once shuffled. ``table`` is
    chunked (one chunk per shard span, the carried rows first): its buffers belong to the
    shards, nothing is copied until a consumer gathers.
    """

    table: pa.Table
    order: np.ndarray
    """int64 positions into ``table``: a permutation of ``range(len(table))``."""
    shuffled: bool
    """False when ``order`` is the identity (a reader without shuffle): batches are slices."""
    key: tuple[str, int, int]
    """(channel, epoch, window): which window this is, for a consumer that caches it."""

    @property
    def num_rows(self) -> int:
        return int(self.table.num_rows)


@dataclass(frozen=True, eq=False)
class WindowSlice:
    """One batch: positions ``[start, stop)`` of its window's permuted order."""

    window: WindowRows
    start: int
    stop: int

    @property
    def num_rows(self) -> int:
        return self.stop - self.start

    def positions(self) -> np.ndarray:
        """Rows of ``window.table`` that make this batch, in batch order."""
        return self.window.order[self.start : self.stop]

    def column(self, name: str) -> pa.Array:
        """One column of the batch, gathered on the host (cheap for a narrow column)."""
        values = self.window.table.column(name)
        if not self.window.shuffled:
            return values.slice(self.start, self.num_rows).combine_chunks()
        return values.take(pa.array(self.positions())).combine_chunks()

    def to_batch(self) -> pa.RecordBatch:
        """The batch gathered on the host: the record batch the reader itself yields."""
        table = self.window.table
        if not self.window.shuffled:
            return one_batch(table.slice(self.start, self.num_rows))
        return one_batch(table.take(pa.array(self.positions())))
