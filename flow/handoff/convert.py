"""A Spark DataFrame straight into a PyTorch DataLoader, through the handoff.

    with convert(df) as data:
        for batch in data.dataloader(batch_size=4096):
            ...

What Petastorm's ``make_spark_converter`` offered, on the same writer and reader as the
pipelines: the DataFrame is written once (bucketed and shuffled by Spark) and each dataloader
reads it, shuffled in windows, balanced across ranks, resumable. On a cluster give a
``location`` every machine reaches (``s3://...``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from flow.config import StackConfig
from flow.engine import load_engine, load_tensor_backend
from flow.handoff.plan import World
from flow.handoff.reader import ReadOptions
from flow.storage import location as open_location

__all__ = ["Conversion", "convert"]


@dataclass
class Conversion:
    """A DataFrame written to a handoff channel, ready to be read."""

    location: str
    channel: str
    rows: int
    owned: bool
    """Whether ``delete()`` removes the location (it was made for this conversion)."""

    def dataloader(
        self,
        batch_size: int = 4096,
        *,
        shuffle: bool = True,
        seed: int = 0,
        world: World | None = None,
        columns: Sequence[str] | None = None,
        window_rows: int | None = None,
    ) -> Any:
        """A torch DataLoader of dicts of tensors (one per numeric column or feature block)."""
        options = ReadOptions(
            batch_size=batch_size, shuffle=shuffle, seed=seed, window_rows=window_rows
        )
        backend = load_tensor_backend("torch")
        return backend.dataloader(
            self.location,
            self.channel,
            world=world or World.from_env(),
            options=options,
            columns=columns,
        )

    def delete(self) -> None:
        if self.owned:
            open_location(self.location).remove()

    def __enter__(self) -> Conversion:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.delete()


def convert(
    frame: Any,
    *,
    location: str | None = None,
    channel: str = "data",
    num_buckets: int = 16,
    compression: str | None = "lz4",
    compression_level: int | None = None,
    stack: StackConfig | None = None,
) -> Conversion:
    """Write a Spark DataFrame to the handoff (a fresh folder under $FLOW_HANDOFF by default)."""
    stack = stack or StackConfig.from_env()
    owned = location is None
    where = location or open_location(stack.handoff).child("_converted", uuid.uuid4().hex[:12]).uri
    facts = load_engine("spark").export_dataframe(
        frame,
        where,
        channel,
        {
            "num_buckets": num_buckets,
            "compression": compression,
            "compression_level": compression_level,
        },
    )
    return Conversion(where, channel, int(facts["rows"]), owned)
