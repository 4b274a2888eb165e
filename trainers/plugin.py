"""The ``torch`` tensor backend, registered for ``flow`` (entry point ``primus_flow.trainers``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.data import DataLoader

from flow.handoff import ChannelReader, ReadOptions, World
from trainers.data import HandoffDataset

__all__ = ["TorchBackend"]


class TorchBackend:
    """Handoff channels as torch DataLoaders."""

    def dataloader(
        self,
        where: str,
        channel: str,
        *,
        world: World | None,
        options: ReadOptions | None,
        columns: Sequence[str] | None,
    ) -> DataLoader[dict[str, torch.Tensor]]:
        reader = ChannelReader(where, channel, world=world, options=options)
        # The reader forms the batches: batch_size=None passes them through as they are.
        return DataLoader(HandoffDataset(reader, columns), batch_size=None)
