"""From planned windows to batches: the shards a window needs, opened ahead and released after.

The reader (:mod:`flow.handoff.reader`) decides which windows come, in which order; this module
does the I/O and the gathering for each: it opens the shards in the order the plan will use
them (checksums verified, decoded on background threads), concatenates a window's spans, and
cuts the batches, gathered on the host (:meth:`Materializer.window`) or left for the consumer to
gather (:meth:`Materializer.window_slices`). It also keeps the references (commit, shard, row)
of the rows a window carries into the next, which is what a cursor stores.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from flow.handoff.channel import Channel
from flow.handoff.format import Commit
from flow.handoff.options import ReadOptions, ReadStats
from flow.handoff.plan import BatchPlan, Span, Window
from flow.handoff.shards import read_shard
from flow.handoff.slices import WindowRows, WindowSlice, one_batch

__all__ = ["NO_REFS", "Materializer"]

NO_REFS = np.empty((0, 3), dtype=np.int64)
"""No rows carried: an empty (commit, shard, row) array."""
_SAMPLE = 16  # one batch in this many is measured for shuffle quality


class Materializer:
    """Turns windows into record batches; keeps only the shards still needed open.

    Shards are opened in the order the plan will use them, ``ahead_rows`` of them ahead, by two
    background threads: pyarrow releases the GIL while it reads and decompresses, so decoding
    the next shards overlaps gathering the current window. (One thread left the gather waiting
    for shards: two read ~20 % faster on two cores, measured with ``flow bench handoff``.)
    The bound is in rows, not shards: a window of streaming micro-batches' small shards draws on
    dozens of them, and a bound of 8 shards left the gather waiting for most of each window's.
    """

    def __init__(
        self,
        channel: Channel,
        options: ReadOptions,
        stats: ReadStats,
        *,
        epoch: int,
        map_files: bool,
    ) -> None:
        self.channel = channel
        self.epoch = epoch
        self.verify = options.verify
        self.map_files = map_files
        self.stats = stats
        self.ahead_rows = ahead_rows = options.prefetch * options.window
        self.commits: dict[int, Commit] = {}
        self._open: dict[tuple[int, int], pa.Table] = {}
        self._remaining: dict[tuple[int, int], int] = {}
        self._coming: deque[tuple[int, int]] = deque()
        self._loading: dict[tuple[int, int], Future[pa.Table]] = {}
        self._loading_rows = 0
        self._pool = (
            ThreadPoolExecutor(options.threads, thread_name_prefix="handoff-prefetch")
            if ahead_rows
            else None
        )
        self.carry: pa.Table | None = None
        self.carry_refs = NO_REFS

    def close(self) -> None:
        if self._pool is not None:
            for future in self._loading.values():
                future.cancel()
            self._pool.shutdown(wait=True)

    def expect(self, commit: Commit, spans: list[Span]) -> None:
        self.commits[commit.batch_id] = commit
        for span in spans:
            key = (span.commit, span.index)
            if key not in self._remaining:
                self._coming.append(key)
            self._remaining[key] = self._remaining.get(key, 0) + span.rows
        self._fill()

    def _load(self, key: tuple[int, int]) -> pa.Table:
        commit, index = key
        if commit not in self.commits:
            self.commits[commit] = self.channel.commit(commit)
        shard = self.commits[commit].shards[index]
        return read_shard(
            self.channel.folder, shard, verify=self.verify, commit=commit, map_file=self.map_files
        )

    def _fill(self) -> None:
        if self._pool is None:
            return
        # Open shards (the current window's) are not counted: only those decoded ahead of use.
        while self._coming and (not self._loading or self._loading_rows < self.ahead_rows):
            key = self._coming.popleft()
            if key not in self._open and key not in self._loading and key in self._remaining:
                self._loading[key] = self._pool.submit(self._load, key)
                self._loading_rows += self._rows(key)

    def _rows(self, key: tuple[int, int]) -> int:
        return self.commits[key[0]].shards[key[1]].rows

    def _shard(self, commit: int, index: int) -> pa.Table:
        key = (commit, index)
        table = self._open.get(key)
        if table is None:
            future = self._loading.pop(key, None)
            if future is not None:
                self._loading_rows -= self._rows(key)
            table = future.result() if future is not None else self._load(key)
            self._open[key] = table
            self.stats.shards_opened += 1
            self._fill()
        return table

    def skip(self, window: Window) -> None:
        """A window read before the cursor was taken: account its rows, read nothing."""
        for span in window.spans:
            self._used(span)

    def _used(self, span: Span) -> None:
        key = (span.commit, span.index)
        self._remaining[key] = self._remaining.get(key, 0) - span.rows
        if self._remaining[key] <= 0:
            self._open.pop(key, None)
            self._remaining.pop(key, None)
            future = self._loading.pop(key, None)
            if future is not None:  # skipped (read before a resumed cursor) on its way in
                future.cancel()
                self._loading_rows -= self._rows(key)
            self._fill()

    def restore_carry(self, refs: np.ndarray) -> None:
        """Carried rows again, read back from their references (after a resume)."""
        parts = [self._shard(int(c), int(i)).slice(int(r), 1) for c, i, r in refs]
        self.carry = pa.concat_tables(parts).combine_chunks() if parts else None
        self.carry_refs = refs
        for key in [k for k in self._open if k not in self._remaining]:
            del self._open[key]  # opened only for the carried rows

    def window(self, window: Window, batches: list[BatchPlan]) -> list[pa.RecordBatch]:
        """The window's batches, gathered here; what it leaves is carried into the next one."""
        rows = self._rows_of(window, batches)
        if rows is None:
            return []
        # Shuffled: one gather of the window. In order: batches are slices of the shards, and
        # only a batch that straddles two of them is copied.
        ordered = (
            rows.table.take(pa.array(rows.order)).combine_chunks() if window.shuffle else rows.table
        )
        end = batches[-1].stop if batches else 0
        self.carry = ordered.slice(end).combine_chunks() if end < ordered.num_rows else None
        return [one_batch(ordered.slice(plan.start, plan.rows)) for plan in batches]

    def window_slices(self, window: Window, batches: list[BatchPlan]) -> list[WindowSlice]:
        """The window's batches as ranges of its unpermuted rows, for the consumer to gather.

        Only the carried rows (fewer than a batch and a row) are gathered here, in the order
        :meth:`window` carries them, so the next window is the same either way.
        """
        rows = self._rows_of(window, batches)
        if rows is None:
            return []
        end = batches[-1].stop if batches else 0
        left = rows.order[end:]
        self.carry = rows.table.take(pa.array(left)).combine_chunks() if len(left) else None
        return [WindowSlice(rows, plan.start, plan.stop) for plan in batches]

    def _rows_of(self, window: Window, batches: list[BatchPlan]) -> WindowRows | None:
        """The window's rows unpermuted (carried rows first) and its order; None when empty.

        Records shuffle quality for sampled batches and the references of the rows the window
        will carry, and releases the shards the window used up.
        """
        parts: list[pa.Table] = []
        bounds = [0]
        meta: list[tuple[int, int, int]] = []  # per part: commit, shard, first row (-1: carry)
        if window.carry and self.carry is not None:
            parts.append(self.carry)
            bounds.append(self.carry.num_rows)
            meta.append((-1, -1, -1))
        for span in window.spans:
            parts.append(self._shard(span.commit, span.index).slice(span.start, span.rows))
            bounds.append(bounds[-1] + span.rows)
            meta.append((span.commit, span.index, span.start))
        for span in window.spans:
            self._used(span)
        if not parts:
            self.carry, self.carry_refs = None, NO_REFS
            return None
        table = pa.concat_tables(parts)
        order = window.permutation()
        starts = np.asarray(bounds)
        info = np.asarray(meta, dtype=np.int64)

        def part_of(first: int, stop: int | None = None) -> np.ndarray:
            """The part each of the permuted rows ``[first, stop)`` comes from."""
            return np.searchsorted(starts, order[first:stop], side="right") - 1

        shard_ids = np.unique(info[:, :2], axis=0, return_inverse=True)[1].reshape(-1)
        for plan in batches:
            if plan.ordinal % _SAMPLE == 0:  # shuffle quality, sampled: unique() is not free
                self.stats.sampled += 1
                self.stats.distinct_shards += len(
                    np.unique(shard_ids[part_of(plan.start, plan.stop)])
                )
        end = batches[-1].stop if batches else 0
        self.carry_refs = self._refs(order[end:], part_of(end), starts, info)
        key = (self.channel.name, self.epoch, window.ident)
        return WindowRows(table, order, window.shuffle, key)

    def _refs(
        self, positions: np.ndarray, parts: np.ndarray, starts: np.ndarray, info: np.ndarray
    ) -> np.ndarray:
        """(commit, shard, row) of the rows at ``positions`` of the window."""
        offsets = positions - starts[parts]
        refs = np.column_stack([info[parts, 0], info[parts, 1], info[parts, 2] + offsets])
        from_carry = info[parts, 0] < 0
        refs[from_carry] = self.carry_refs[offsets[from_carry]]
        return refs
