"""Batches from the handoff onto the training device, with their cursors and their waits.

Two ways to shuffle (``shuffle_on``):

* ``host``: the reader gathers each window's rows in permuted order and yields record batches;
  each batch is copied to the device.
* ``device``: the reader yields each window once, unpermuted (``ChannelReader.slices()``); its
  columns are packed contiguously, copied to the device in one transfer, and every batch is
  gathered there (``index_select`` with the window's permutation). The batches are the same
  rows in the same order as ``host`` gives, so seeds, every-row-once and cursors are unchanged;
  the host does sequential copies instead of a random gather (the reader's largest cost).
  One window per channel stays on the device, so channels mixed batch by batch do not copy
  their windows again at every switch.

On CUDA a background thread does the host side ahead of the training loop (read, pin, start
the copy on a side stream, gather) and hands over batches whose copy is under way; the compute
stream waits on each batch's event only when it takes the batch. ``ahead`` batches are
prepared at most. On CPU the work happens when the loop asks (the model already uses every
core), unless ``ahead`` says otherwise.

Each batch comes with its channel (a batch never mixes channels: each channel's reader cuts its
own windows, a mixed reader draws whole batches; a window slice names its channel in its key),
the reader's epoch (a row of epoch 1 or later is seen again), a followed channel's origin (the
commits of the batch's window and when they were picked up), and the columns read for metrics
only, on the host and never handed to the model: event and production times, an oracle's
probabilities and the rows' label keys (hashed), nulls kept as markers. ``optional`` columns
(the row ``weight``) join the tensors where a channel has them.

Each batch comes with the reader's cursor *after* it, taken right after the reader produced
it (on whichever thread pulls), so a checkpoint at any step resumes at the next batch, with
nothing re-read or skipped. Waiting is measured per batch, the loop's wait and, on CUDA, the
GPU's idle time before the batch (:class:`StallMeter`): the data-stall fraction is the latter
over the wall time.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import pyarrow as pa
import torch

from flow.errors import ConfigError
from flow.handoff import Origin, WindowSlice
from trainers.data import key_hashes, pack_columns, probabilities, timestamps_us, to_tensors

__all__ = ["Batch", "DeviceLoader", "ShuffleOn", "StallMeter"]

ShuffleOn = Literal["host", "device"]


class Reader(Protocol):
    def __iter__(self) -> Iterator[pa.RecordBatch]: ...

    def slices(self) -> Iterator[WindowSlice]: ...

    def state_dict(self) -> dict[str, Any]: ...


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor]
    cursor: dict[str, Any]
    """The reader's cursor after this batch: resume here and the next batch comes next."""
    rows: int
    wait_s: float
    """Seconds the trainer waited for this batch (reading, decoding, copying)."""
    event_time_us: np.ndarray | None = None
    """Event times of the rows (int64 microseconds since the epoch, ``data.NO_TIME`` where
    null) when the channel has the column."""
    channel: str | None = None
    """The channel the batch came from (mixed readers say which)."""
    epoch: int = 0
    """The reader's epoch: rows of epoch 1 and later were trained on before."""
    produced_us: np.ndarray | None = None
    """When each row was produced (the Kafka record's time), like ``event_time_us``."""
    oracle: np.ndarray | None = None
    """Each row's true click probability (float64, NaN where null), for metrics only."""
    keys: np.ndarray | None = None
    """The rows' label keys as int64 hashes (``data.NO_KEY`` where null), for metrics only: they
    tie an immediate channel's positive row to its impression."""
    origin: Origin | None = None
    """A followed channel's batch: the commits of its shuffle window and when the reader picked
    each up (``ChannelReader.origin``), for freshness by leg."""
    ready: torch.cuda.Event | None = None
    """Recorded on the copy stream after the batch's tensors were written (CUDA only)."""
    idle: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
    """CUDA: events on the compute stream when the loop asked for this batch (after the last
    step's work) and when the batch was ready there; the time between them on the GPU's own
    clock is how long the GPU sat idle waiting for it (see :class:`StallMeter`)."""


class StallMeter:
    """Seconds training waited for data.

    On CUDA this is the GPU's idle time between a step's last kernel and the next batch being
    ready on the compute stream, read from event pairs (:attr:`Batch.idle`). The loop's own
    wait is no measure there: the loop only queues work, and a GPU with steps queued is busy
    while the loop waits. On CPU, where the loop does the work, it is the loop's wait.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def add(self, batch: Batch) -> None:
        if batch.idle is None:
            self.seconds += batch.wait_s
        else:
            self._pending.append(batch.idle)

    def total(self) -> float:
        """The seconds so far (waits for the GPU to reach the last batch added)."""
        if self._pending:
            self._pending[-1][1].synchronize()
            self.seconds += sum(a.elapsed_time(b) for a, b in self._pending) / 1000
            self._pending = []
        return self.seconds


@dataclass
class _OnDevice:
    """The window whose rows are on the device now, and its permutation there."""

    key: tuple[str, int, int]
    columns: dict[str, torch.Tensor]
    order: torch.Tensor


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


class DeviceLoader:
    """Iterate a reader's batches as tensors on ``device``."""

    def __init__(
        self,
        reader: Reader,
        device: torch.device,
        columns: list[str],
        *,
        optional: Sequence[str] = (),
        event_time: str | None = None,
        produced_time: str | None = None,
        oracle: str | None = None,
        key: Callable[[str | None], str | None] | None = None,
        shuffle_on: ShuffleOn = "host",
        ahead: int | None = None,
    ) -> None:
        if shuffle_on not in ("host", "device"):
            raise ConfigError(f"shuffle_on={shuffle_on!r}: use 'host' or 'device'")
        self.reader = reader
        self.device = device
        self.columns = columns
        self.optional = list(optional)
        """Tensor columns read where a batch has them (e.g. ``weight``)."""
        self.event_time = event_time
        self.produced_time = produced_time
        self.oracle = oracle
        self.key = key
        """The label key column of a batch's channel, if it has one."""
        self.shuffle_on = shuffle_on
        self.cuda = device.type == "cuda"
        self.ahead = (4 if self.cuda else 0) if ahead is None else ahead
        self._stream = torch.cuda.Stream(device) if self.cuda else None  # type: ignore[no-untyped-call]
        self._windows: dict[str, _OnDevice] = {}
        """Per channel, its window on the device now: a mix alternates channels batch by batch,
        and one window for all would be packed and copied again at every switch."""

    # -- one batch, host side then device side ----------------------------------------------

    def _channel(self, item: pa.RecordBatch | WindowSlice) -> str | None:
        if isinstance(item, WindowSlice):
            return item.window.key[0]
        mixed = getattr(self.reader, "last_channel", None)
        single = getattr(getattr(self.reader, "channel", None), "name", None)
        return str(mixed or single) if (mixed or single) else None

    @staticmethod
    def _column(item: pa.RecordBatch | WindowSlice, name: str | None) -> pa.Array | None:
        """One column of the batch gathered on the host, None without it."""
        if name is None:
            return None
        if isinstance(item, WindowSlice):
            return item.column(name) if name in item.window.table.schema.names else None
        return item.column(name) if name in item.schema.names else None

    def _present(self, names: Sequence[str]) -> list[str]:
        return self.columns + [c for c in self.optional if c in names]

    def _prepare(self, item: pa.RecordBatch | WindowSlice) -> Batch:
        """``item`` as tensors on the device (their copy issued, maybe not finished)."""
        cursor = self.reader.state_dict()  # after this item, before any later pull
        batch = Batch({}, cursor, item.num_rows, 0.0, channel=self._channel(item))
        batch.epoch = int(getattr(self.reader, "epoch", 0))
        batch.origin = getattr(self.reader, "origin", None)
        event = self._column(item, self.event_time)
        produced = self._column(item, self.produced_time)
        oracle = self._column(item, self.oracle)
        if event is not None and self.event_time is not None:
            batch.event_time_us = timestamps_us(event, self.event_time)
        if produced is not None and self.produced_time is not None:
            batch.produced_us = timestamps_us(produced, self.produced_time)
        if oracle is not None and self.oracle is not None:
            batch.oracle = probabilities(oracle, self.oracle)
        key = self.key(batch.channel) if self.key is not None else None
        keys = self._column(item, key)
        if keys is not None and key is not None:
            batch.keys = key_hashes(keys, key)
        if self._stream is None:
            batch.tensors = self._tensors(item)
            return batch
        with torch.cuda.device(self.device), torch.cuda.stream(self._stream):
            batch.tensors = self._tensors(item)
            batch.ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
            batch.ready.record(self._stream)
        return batch

    def _tensors(self, item: pa.RecordBatch | WindowSlice) -> dict[str, torch.Tensor]:
        if not isinstance(item, WindowSlice):
            tensors = to_tensors(item, self._present(item.schema.names))
            if not self.cuda:
                return tensors  # zero-copy views of the reader's buffers
            return {
                k: v.pin_memory().to(self.device, non_blocking=True) for k, v in tensors.items()
            }
        window = self._upload(item)
        positions = window.order[item.start : item.stop]
        if not item.window.shuffled:
            return {k: v[item.start : item.stop] for k, v in window.columns.items()}
        return {k: v.index_select(0, positions) for k, v in window.columns.items()}

    def _upload(self, item: WindowSlice) -> _OnDevice:
        """The slice's window on the device: packed and copied once, at its first slice."""
        channel = item.window.key[0]
        found = self._windows.get(channel)
        if found is not None and found.key == item.window.key:
            return found
        self._windows.pop(channel, None)  # free the channel's last window before the next
        table = item.window.table
        packed = pack_columns(table, self._present(table.schema.names), pin=self.cuda)
        order = torch.from_numpy(item.window.order)
        if self.cuda:
            order = order.pin_memory()
        window = self._windows[channel] = _OnDevice(
            item.window.key,
            {k: v.to(self.device, non_blocking=True) for k, v in packed.items()},
            order.to(self.device, non_blocking=True),
        )
        return window

    def _items(self) -> Iterator[pa.RecordBatch | WindowSlice]:
        if self.shuffle_on == "device":
            return self.reader.slices()
        return iter(self.reader)

    # -- the loop's side ---------------------------------------------------------------------

    def _asked(self) -> torch.cuda.Event | None:
        """On CUDA, an event after the work the loop has queued so far (the last step)."""
        if not self.cuda:
            return None
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(self.device))
        return event

    def _take(self, batch: Batch, asked: torch.cuda.Event | None) -> Batch:
        """Make the compute stream wait for the batch's copy, and keep its memory until then."""
        if batch.ready is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(batch.ready)
            for value in batch.tensors.values():
                value.record_stream(compute)
            if asked is not None:
                ready = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                ready.record(compute)
                batch.idle = (asked, ready)
        return batch

    def __iter__(self) -> Iterator[Batch]:
        """Wait time: from the loop asking for a batch to getting it (the loop's stall)."""
        self._windows = {}
        if self.ahead > 0:
            yield from self._threaded()
            return
        items = self._items()
        asked, event = time.perf_counter(), self._asked()
        for item in items:
            batch = self._take(self._prepare(item), event)
            batch.wait_s = time.perf_counter() - asked
            yield batch
            asked, event = time.perf_counter(), self._asked()

    def _threaded(self) -> Iterator[Batch]:
        ready: queue.Queue[Any] = queue.Queue(maxsize=self.ahead)
        stop = threading.Event()
        worker = threading.Thread(
            target=self._produce, args=(ready, stop), name="handoff-loader", daemon=True
        )
        worker.start()
        try:
            while True:
                asked, event = time.perf_counter(), self._asked()
                got = ready.get()
                if got is _END:
                    return
                if isinstance(got, _Failed):
                    raise got.error
                batch = self._take(got, event)
                batch.wait_s = time.perf_counter() - asked
                yield batch
        finally:
            stop.set()
            while worker.is_alive():  # unblock a producer waiting for room, then let it end
                with contextlib.suppress(queue.Empty):
                    ready.get(timeout=0.05)
            worker.join()

    def _produce(self, ready: queue.Queue[Any], stop: threading.Event) -> None:
        items = self._items()
        try:
            for item in items:
                if stop.is_set():
                    return
                ready.put(self._prepare(item))
            ready.put(_END)
        except BaseException as error:  # handed to the loop, which raises it
            ready.put(_Failed(error))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # the reader's generator releases its shards and threads now
