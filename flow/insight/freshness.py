"""How fresh a channel's rows were when they were committed: per row, from the event (and from
its production to Kafka) to the commit that made it readable.

Read from the shards and commit records (pyarrow, no Spark): a row's ``produced_at`` (the Kafka
record's time, see :data:`flow.pipeline.PRODUCED_AT`) and its event time against its commit's
``committed_at``. The trainer measures the last leg, to training, itself (docs/trainers.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flow.handoff.channel import Channel
from flow.handoff.shards import read_shard
from flow.pipeline.sources import PRODUCED_AT

__all__ = ["Freshness", "channel_freshness", "lag_quantiles"]

QUANTILES = (0.5, 0.9, 0.99)


def lag_quantiles(seconds: np.ndarray) -> dict[str, float]:
    """``p50``, ``p90``, ``p99`` and ``max`` of lags in seconds (empty: nothing)."""
    if not len(seconds):
        return {}
    found = {f"p{round(q * 100)}": float(np.quantile(seconds, q)) for q in QUANTILES}
    return found | {"max": float(seconds.max())}


@dataclass
class Freshness:
    """Lags in seconds to the commit, by where they start (quantiles, see lag_quantiles)."""

    channel: str
    rows: int = 0
    commits: int = 0
    produced_to_committed: dict[str, float] = field(default_factory=dict)
    event_to_committed: dict[str, float] = field(default_factory=dict)
    positives: int = 0
    """Rows labelled 1 (with immediate labels, each also left earlier as a negative)."""


def _micros(column: pa.ChunkedArray) -> np.ndarray:
    valid = pc.drop_null(column)
    return np.asarray(valid.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()), dtype=np.int64)


def channel_freshness(
    where: str,
    channel: str,
    *,
    event_time: str = "ts",
    since: datetime | None = None,
    label: str = "label",
) -> Freshness:
    """Per-row lags from production and from the event to the commit, over the channel's
    commits (those committed at or after ``since`` only, if given). Rows without a
    ``produced_at`` (table rows) count only in the event lag."""
    found = Channel(where, channel)
    result = Freshness(channel)
    produced: list[np.ndarray] = []
    events: list[np.ndarray] = []
    for batch_id in found.commit_ids():
        commit = found.commit(batch_id)
        committed = datetime.fromisoformat(commit.committed_at)
        if since is not None and committed < since:
            continue
        at = int(committed.timestamp() * 1_000_000)
        for shard in commit.shards:
            table = read_shard(found.folder, shard, commit=batch_id)
            result.rows += table.num_rows
            if label in table.column_names:
                result.positives += int(pc.sum(pc.equal(table.column(label), 1.0)).as_py() or 0)
            if PRODUCED_AT in table.column_names:
                produced.append((at - _micros(table.column(PRODUCED_AT))) / 1e6)
            if event_time in table.column_names:
                events.append((at - _micros(table.column(event_time))) / 1e6)
        result.commits += 1
    if produced:
        result.produced_to_committed = lag_quantiles(np.concatenate(produced))
    if events:
        result.event_to_committed = lag_quantiles(np.concatenate(events))
    return result
