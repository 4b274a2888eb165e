"""A channel reader that opens its channel when first iterated (it may not exist before).

Read in order (history, then live), the live channel is needed only once the history is done;
its writer creates it with its first commit, which may come after the trainer has started.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa

from flow.errors import ConfigError
from flow.handoff import Channel, ChannelReader, Origin, ReadOptions, WindowSlice, World
from flow.handoff.reader import EVERY_RANK

__all__ = ["LazyReader"]

_UNOPENED = "unopened"
POLL_S = 0.5
"""Seconds between looks for a channel that does not exist yet."""


def pause(seconds: float) -> None:
    """How a lazy reader waits for its channel (a module function, so tests replace it)."""
    time.sleep(seconds)


class LazyReader:
    """Like :class:`~flow.handoff.ChannelReader`, opened (and waited for) at the first batch."""

    def __init__(
        self,
        where: str,
        channel: str,
        world: World,
        options: ReadOptions,
        wait_s: float,
        layout: Mapping[str, Any] | None,
    ) -> None:
        self.where, self.name, self.world, self.options = where, channel, world, options
        self.wait_s = wait_s
        self.layout = dict(layout) if layout else None
        self.reader: ChannelReader | None = None
        self._pending: dict[str, Any] | None = None

    @property
    def epoch(self) -> int:
        return self.reader.epoch if self.reader is not None else 0

    @property
    def origin(self) -> Origin | None:
        return self.reader.origin if self.reader is not None else None

    def _open(self) -> ChannelReader:
        deadline = time.monotonic() + self.wait_s
        while not Channel(self.where, self.name).exists() and time.monotonic() < deadline:
            pause(POLL_S)
        reader = ChannelReader(self.where, self.name, world=self.world, options=self.options)
        layout = reader.channel.meta().layout
        if self.layout is not None and layout != self.layout:
            raise ConfigError(
                f"channel {self.name!r} has another feature layout than the channel read before "
                "it; channels read together need one feature spec and feature state"
            )
        if self._pending is not None:
            reader.load_state_dict(self._pending)
        return reader

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        if self.reader is None:
            self.reader = self._open()
        yield from self.reader

    def slices(self) -> Iterator[WindowSlice]:
        if self.reader is None:
            self.reader = self._open()
        yield from self.reader.slices()

    def state_dict(self) -> dict[str, Any]:
        if self.reader is not None:
            return self.reader.state_dict()
        return self._pending if self._pending is not None else {_UNOPENED: True}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ranks = state.get(EVERY_RANK)
        if state.get(_UNOPENED) or (ranks and all(r.get(_UNOPENED) for r in ranks)):
            return
        if self.reader is not None:
            self.reader.load_state_dict(state)
        else:
            self._pending = dict(state)
