"""Training-row channels with a planted signal, written as a pipeline stage writes them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from flow.handoff import Channel, Commit
from flow.pipeline.state import Layout

LAYOUT = Layout(
    dense=("age", "price"),
    sparse=(("user", 50), ("item", 40), ("country", 8)),
    sequences=(),
)
SCHEMA = pa.schema(
    [
        pa.field("label", pa.float32(), False),
        pa.field("dense", pa.list_(pa.float32(), 2), False),
        pa.field("sparse", pa.list_(pa.int64(), 3), False),
        pa.field("event_time", pa.timestamp("us", tz="UTC")),
    ]
)


def rows(n: int, seed: int, first_id: int = 0) -> pa.Table:
    """Clicks depend on the item (some items are clicked far more) and on price.

    The user column numbers the rows (``first_id + i``, modulo nothing: ids may exceed the
    table's cardinality, which the model hashes down) so tests can tell rows apart.
    """
    rng = np.random.default_rng(seed)
    item = rng.integers(1, 40, n)
    price = rng.normal(0, 1, n).astype(np.float32)
    logit = np.where(item % 3 == 0, 1.5, -1.5) - price
    label = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    dense = np.column_stack([rng.normal(0, 1, n).astype(np.float32), price])
    sparse = np.column_stack([first_id + np.arange(n), item, rng.integers(0, 8, n)])
    now_us = int(pa.scalar(np.datetime64("now", "us")).value)
    return pa.table(
        [
            pa.array(label),
            pa.FixedSizeListArray.from_arrays(pa.array(dense.reshape(-1)), 2),
            pa.FixedSizeListArray.from_arrays(pa.array(sparse.reshape(-1).astype(np.int64)), 3),
            pa.array(np.full(n, now_us), pa.timestamp("us", tz="UTC")),
        ],
        schema=SCHEMA,
    )


def write(root: Path, name: str, commits: list[int], seed: int = 0, buckets: int = 4) -> int:
    """Commits of the given row counts; returns the number of rows written."""
    channel = Channel(str(root), name)
    meta = channel.create(SCHEMA, num_buckets=buckets, layout=LAYOUT.to_dict())
    first = 0
    for batch_id, count in enumerate(commits):
        table = rows(count, seed + batch_id, first_id=first)
        first += count
        per = -(-count // buckets)
        shards = tuple(
            channel.write_bucket(batch_id, b, table.slice(b * per, per), f"t{b}")
            for b in range(buckets)
        )
        channel.add_commit(Commit(name, batch_id, shards, meta.fingerprint))
    return first
