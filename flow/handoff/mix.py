"""Mixing channels (e.g. ``backfill`` and ``live``) into one stream of batches.

* ``weights``: before each batch a seeded draw picks a channel with probability proportional to
  its weight among the channels not yet exhausted. Every rank draws the same sequence, so ranks
  stay in step; a followed channel is waited for when drawn.
* ``priority``: channels one after the other, in the order given (e.g. the history, then the
  live stream it leads into).

The cursor holds each channel's cursor, the number of draws and the channels already exhausted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa

from flow.errors import ConfigError
from flow.handoff.pickup import Origin
from flow.handoff.reader import EVERY_RANK, every_rank
from flow.handoff.slices import WindowSlice

__all__ = ["BatchSource", "MixedReader"]


class BatchSource(Protocol):
    """What a mix draws from: a ChannelReader, or anything that iterates and resumes like one."""

    def __iter__(self) -> Iterator[pa.RecordBatch]: ...

    def slices(self) -> Iterator[WindowSlice]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


T = TypeVar("T")


class MixedReader:
    """Batches from several channels, mixed by weights or by priority, deterministically."""

    def __init__(
        self,
        readers: Mapping[str, BatchSource],
        *,
        weights: Mapping[str, float] | None = None,
        priority: Sequence[str] | None = None,
        seed: int = 0,
    ) -> None:
        if (weights is None) == (priority is None):
            raise ConfigError("mix channels by weights=... or by priority=..., exactly one of them")
        names = set(weights or {}) | set(priority or [])
        if names != set(readers):
            raise ConfigError(
                f"the mix names channels {sorted(names)}, the readers are for {sorted(readers)}"
            )
        if weights is not None and any(w <= 0 for w in weights.values()):
            raise ConfigError(f"weights {dict(weights)} must all be positive")
        self.readers = dict(readers)
        self.weights = dict(weights) if weights is not None else None
        self.priority = list(priority) if priority is not None else None
        self.seed = seed
        self.epoch = 0
        self.draws = 0
        self.exhausted: list[str] = []
        self.last_channel: str | None = None
        """The channel the last batch came from."""

    @property
    def origin(self) -> Origin | None:
        """The last batch's channel reader's :attr:`~flow.handoff.ChannelReader.origin`."""
        reader = self.readers.get(self.last_channel) if self.last_channel else None
        found: Origin | None = getattr(reader, "origin", None)
        return found

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "draws": self.draws,
            "exhausted": list(self.exhausted),
            "readers": {n: r.state_dict() for n, r in self.readers.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after a cursor of this mix, or every rank's (:func:`every_rank`) of a
        world of another size: each channel's epoch is then re-cut, and the draws go on."""
        if EVERY_RANK in state:
            cursors = state[EVERY_RANK]
            # Ranks draw in step: they agree on the mix, and differ only in their channels'.
            mixes = {repr({k: c[k] for k in ("epoch", "draws", "exhausted")}) for c in cursors}
            if len(mixes) > 1:
                raise ConfigError(
                    "the ranks' cursors disagree on the mix's draws: resume from every rank's "
                    "cursor of one checkpoint"
                )
            channels = {n: every_rank([c["readers"][n] for c in cursors]) for n in self.readers}
            state = {**cursors[0], "readers": channels}
        if set(state["readers"]) != set(self.readers):
            raise ConfigError(
                f"this cursor mixes {sorted(state['readers'])}, not {sorted(self.readers)}"
            )
        self.epoch, self.draws = state["epoch"], state["draws"]
        self.exhausted = list(state["exhausted"])
        for name, reader in self.readers.items():
            reader.load_state_dict(state["readers"][name])

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return self._mix(iter)

    def slices(self) -> Iterator[WindowSlice]:
        """The same mix of the channels' window slices (see ``ChannelReader.slices``)."""
        return self._mix(lambda reader: reader.slices())

    def _mix(self, items: Callable[[BatchSource], Iterator[T]]) -> Iterator[T]:
        if self.priority is not None:
            yield from self._by_priority(self.priority, items)
        else:
            yield from self._by_weight(items)
        self.epoch += 1
        self.draws = 0
        self.exhausted = []

    def _by_priority(
        self, order: list[str], items: Callable[[BatchSource], Iterator[T]]
    ) -> Iterator[T]:
        for name in order:
            if name in self.exhausted:
                continue
            for batch in items(self.readers[name]):
                self.last_channel = name
                yield batch
            self.exhausted.append(name)

    def _by_weight(self, items: Callable[[BatchSource], Iterator[T]]) -> Iterator[T]:
        weights = self.weights or {}
        generator = np.random.PCG64([self.seed, self.epoch])
        generator.advance(self.draws)  # one step per draw: resuming replays nothing
        rng = np.random.Generator(generator)
        iterators = {n: items(r) for n, r in self.readers.items() if n not in self.exhausted}
        names = [n for n in weights if n in iterators]
        while names:
            shares = np.array([weights[n] for n in names])
            u = rng.random()
            self.draws += 1
            name = names[int(np.searchsorted(np.cumsum(shares) / shares.sum(), u, side="right"))]
            try:
                batch = next(iterators[name])
            except StopIteration:
                names.remove(name)
                self.exhausted.append(name)
                continue
            self.last_channel = name
            yield batch
