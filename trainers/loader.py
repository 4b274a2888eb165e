"""Batches from the handoff onto the training device, with their cursors and their waits.

On CUDA the next batch is copied to pinned host memory and sent to the GPU on a side stream
(``non_blocking``) while the current step runs; the compute stream waits on an event only when
it takes the batch. On CPU the reader's zero-copy views are used as they are.

Each batch comes with the reader's cursor *after* it (taken before the next batch is pulled,
even when that pull happens ahead of time), so a checkpoint at any step resumes at the next
batch, with nothing re-read or skipped. The time spent waiting for data is measured per batch:
it is what the data-stall fraction divides by the step time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
import torch

from trainers.data import to_tensors

__all__ = ["Batch", "DeviceLoader"]


class Reader(Protocol):
    def __iter__(self) -> Iterator[pa.RecordBatch]: ...

    def state_dict(self) -> dict[str, Any]: ...


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor]
    cursor: dict[str, Any]
    """The reader's cursor after this batch: resume here and the next batch comes next."""
    rows: int
    wait_s: float
    """Seconds the trainer waited for this batch (reading, decoding, copying)."""
    event_time_us: torch.Tensor | None = None
    """Event times of the rows (microseconds since the epoch) when the channel has them."""
    channel: str | None = None
    """The channel the batch came from (mixed readers say which)."""


class DeviceLoader:
    """Iterate a reader's batches as tensors on ``device``."""

    def __init__(
        self,
        reader: Reader,
        device: torch.device,
        columns: list[str],
        *,
        event_time: str | None = None,
    ) -> None:
        self.reader = reader
        self.device = device
        self.columns = columns
        self.event_time = event_time
        self.cuda = device.type == "cuda"
        self._stream = torch.cuda.Stream(device) if self.cuda else None  # type: ignore[no-untyped-call]

    def _pull(self, batches: Iterator[pa.RecordBatch]) -> Batch | None:
        try:
            record = next(batches)
        except StopIteration:
            return None
        cursor = self.reader.state_dict()  # after this batch, before any later pull
        tensors = to_tensors(record, self.columns)
        times = None
        if self.event_time is not None and self.event_time in record.schema.names:
            times = to_tensors(record, [self.event_time])[self.event_time].clone()
        if self._stream is not None:
            with torch.cuda.stream(self._stream):
                tensors = {
                    k: v.pin_memory().to(self.device, non_blocking=True) for k, v in tensors.items()
                }
        return Batch(tensors, cursor, record.num_rows, 0.0, times, self._channel())

    def _channel(self) -> str | None:
        mixed = getattr(self.reader, "last_channel", None)
        single = getattr(getattr(self.reader, "channel", None), "name", None)
        return str(mixed or single) if (mixed or single) else None

    def __iter__(self) -> Iterator[Batch]:
        """Wait time: from the loop asking for a batch to getting it (the loop's stall)."""
        batches = iter(self.reader)
        asked = time.perf_counter()
        ahead = self._pull(batches)
        while ahead is not None:
            current = ahead
            if self._stream is not None:
                # Take this batch on the compute stream, then start copying the next one: the
                # copy runs beside the step that uses this batch.
                compute = torch.cuda.current_stream(self.device)
                compute.wait_stream(self._stream)
                for value in current.tensors.values():
                    value.record_stream(compute)
                ahead = self._pull(batches)
            current.wait_s = time.perf_counter() - asked
            yield current
            asked = time.perf_counter()
            if self._stream is None:
                ahead = self._pull(batches)
