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


DELAYED_LAYOUT = Layout(dense=("a", "b", "c"), sparse=(("bucket", 4),), sequences=())


def write_delayed(
    root: Path,
    name: str,
    strategy: str,
    impressions: int,
    seed: int = 0,
    *,
    oracle: bool = True,
    commits: int = 4,
    key_column: bool = True,
) -> int:
    """Rows of tests/trainers/delayed.py's click model, labelled by ``strategy``: ``window``
    (one row per impression with its final label, no production time, as a backfill writes)
    or ``immediate`` (each impression a negative, each click a positive again, in emission
    order, produced when emitted). Event times end about now. The label key, ``impression_id``,
    is in the channel's labels, and its column in the rows with ``key_column``. Returns the rows
    written."""
    from tests.trainers.delayed import WINDOW_S, immediate_rows
    from tests.trainers.delayed import impressions as draw

    found = draw(impressions, seed=seed, span_s=4 * 3600.0)
    now_s = float(np.datetime64("now", "s").astype(np.int64)) - 4 * 3600.0 - WINDOW_S
    if strategy == "immediate":
        rows = immediate_rows(found)
        features, label, p = rows.features, rows.label, rows.p_click
        event, produced, which = rows.event_s, rows.emitted_s, rows.impression
    else:
        features, label, p = found.features, found.clicked.astype(np.float32), found.p_click
        event, produced, which = found.time_s, None, np.arange(len(found.time_s))
    n = len(label)
    fields = [
        pa.field("label", pa.float32(), False),
        pa.field("weight", pa.float32(), False),
        pa.field("dense", pa.list_(pa.float32(), 3), False),
        pa.field("sparse", pa.list_(pa.int64(), 1), False),
        pa.field("ts", pa.timestamp("us", tz="UTC")),
        pa.field("produced_at", pa.timestamp("us", tz="UTC")),
    ] + ([pa.field("p_click", pa.float64())] if oracle else [])
    fields += [pa.field("impression_id", pa.string())] if key_column else []
    stamp = pa.timestamp("us", tz="UTC")
    columns = [
        pa.array(label),
        pa.array(np.ones(n, dtype=np.float32)),
        pa.FixedSizeListArray.from_arrays(pa.array(features.reshape(-1)), 3),
        pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(n, dtype=np.int64)), 1),
        pa.array(((now_s + event) * 1e6).astype(np.int64), stamp),
        pa.array(((now_s + produced) * 1e6).astype(np.int64), stamp)
        if produced is not None
        else pa.nulls(n, stamp),
    ] + ([pa.array(p)] if oracle else [])
    columns += [pa.array([f"{seed}-{i}" for i in which.tolist()])] if key_column else []
    schema = pa.schema(fields)
    table = pa.table(columns, schema=schema)
    channel = Channel(str(root), name)
    meta = channel.create(
        schema,
        num_buckets=2,
        layout=DELAYED_LAYOUT.to_dict(),
        labels={"strategy": strategy, "window": f"{WINDOW_S:.0f} seconds", "key": "impression_id"},
    )
    per = -(-n // commits)
    for batch_id in range(commits):
        part = table.slice(batch_id * per, per)
        half = -(-part.num_rows // 2)
        shards = tuple(
            channel.write_bucket(batch_id, b, part.slice(b * half, half), f"t{b}") for b in range(2)
        )
        channel.add_commit(Commit(name, batch_id, shards, meta.fingerprint))
    return n
