"""The loader a PyTorch user writes without the handoff: a DataLoader over Parquet files.

Spark writes training rows as Parquet (flat columns: ``label``, ``d0..d12``, ``c0..c25``); the
usual way to feed them to a GPU is an ``IterableDataset`` whose workers split the row groups,
read them with pyarrow in a seeded random order, permute each row group's rows and cut
fixed-size batches, with ``DataLoader(num_workers=N, pin_memory=True)`` around it. That is
what this is, written as well as such a loader is usually written (columns stacked with numpy
once per row group, not per row; whole batches, not per-sample collation), so the comparison
is against a competent baseline, not a strawman.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

__all__ = ["ParquetBatches", "parquet_loader"]


class ParquetBatches(IterableDataset[dict[str, torch.Tensor]]):
    """Batches of ``batch_size`` rows from Parquet files, shuffled by row group and within it."""

    def __init__(self, files: list[Path], batch_size: int, dense: int, sparse: int, seed: int = 0):
        self.files = [str(f) for f in files]
        self.batch_size = batch_size
        self.dense = [f"d{j}" for j in range(dense)]
        self.sparse = [f"c{j}" for j in range(sparse)]
        self.seed = seed

    def _groups(self) -> list[tuple[str, int]]:
        return [(f, g) for f in self.files for g in range(pq.ParquetFile(f).num_row_groups)]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rng = np.random.default_rng([self.seed, worker])
        groups = self._groups()
        mine = [groups[i] for i in rng.permutation(len(groups)) if i % workers == worker]
        opened: dict[str, pq.ParquetFile] = {}
        left: list[np.ndarray] | None = None
        for path, group in mine:
            table = opened.setdefault(path, pq.ParquetFile(path)).read_row_group(group)
            columns = [
                table.column("label").to_numpy(),
                np.stack([table.column(c).to_numpy() for c in self.dense], axis=1),
                np.stack([table.column(c).to_numpy() for c in self.sparse], axis=1),
            ]
            order = rng.permutation(table.num_rows)
            columns = [c[order] for c in columns]
            if left is not None:
                columns = [np.concatenate([a, b]) for a, b in zip(left, columns, strict=True)]
            full = len(columns[0]) // self.batch_size * self.batch_size
            for start in range(0, full, self.batch_size):
                label, dense, sparse = (c[start : start + self.batch_size] for c in columns)
                yield {
                    "label": torch.from_numpy(label),
                    "dense": torch.from_numpy(dense),
                    "sparse": torch.from_numpy(sparse),
                }
            left = [c[full:] for c in columns]


def parquet_loader(
    folder: Path, batch_size: int, workers: int, *, pin: bool, dense: int, sparse: int
) -> DataLoader[dict[str, torch.Tensor]]:
    """``DataLoader(ParquetBatches(...), num_workers=workers, pin_memory=pin)``.

    Workers start by forkserver: the trainer's process already runs CUDA and threads, which a
    forked child must not inherit.
    """
    files = sorted(folder.glob("*.parquet"))
    dataset = ParquetBatches(files, batch_size, dense, sparse)
    return DataLoader(
        dataset,
        batch_size=None,
        num_workers=workers,
        pin_memory=pin,
        prefetch_factor=4 if workers else None,
        multiprocessing_context="forkserver" if workers else None,
    )
