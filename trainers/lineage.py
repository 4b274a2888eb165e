"""What fed a model: the handoff commits a trainer read and the sources behind them.

Every commit records its source positions (Iceberg snapshot ids, Kafka offset ranges) and event
time range. The trainer logs the commits it read as an artifact, and one tag per channel and
source (``lineage.<channel>.<source>``), so a registered model leads back to the snapshots and
offsets it was trained on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from flow.handoff import Channel, ChannelReader
from flow.tracking import Run
from flow.training import TrainConfig

__all__ = ["commits_read", "lineage_tags", "log_lineage"]


def _last_read(cursor: Mapping[str, Any], channel: str) -> int:
    """The highest batch id the cursor has read from, wholly or in part (-1: none)."""
    state = cursor.get("readers", {}).get(channel, cursor) if "readers" in cursor else cursor
    after = int(state.get("after", -1))
    # The commit after the last whole one is in progress once a batch of it was yielded.
    return after + 1 if int(state.get("position", 0)) > 0 else after


def commits_read(
    handoff: str, channels: tuple[str, ...], cursor: Mapping[str, Any], after: int = -1
) -> dict[str, list[dict[str, Any]]]:
    """Per channel: the commits after batch ``after`` (an incremental run's ``after_commit``)
    up to the cursor (batch id, rows, bytes, sources, times)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for name in channels:
        channel = Channel(handoff, name)
        upto = _last_read(cursor, name)
        found[name] = [
            {
                "batch_id": commit.batch_id,
                "rows": commit.rows,
                "bytes": commit.bytes,
                "source_positions": commit.source_positions,
                "event_time": commit.event_time,
                "committed_at": commit.committed_at,
            }
            for commit in (channel.commit(b) for b in channel.commit_ids() if after < b <= upto)
        ]
    return found


def lineage_tags(commits: Mapping[str, list[dict[str, Any]]]) -> dict[str, str]:
    """``lineage.<channel>.<source>``: the distinct positions read (first..last when many)."""
    tags: dict[str, str] = {}
    for channel, entries in commits.items():
        tags[f"lineage.{channel}.commits"] = (
            f"{entries[0]['batch_id']}..{entries[-1]['batch_id']}" if entries else "none"
        )
        keys = sorted({k for e in entries for k in e["source_positions"]})
        for key in keys:
            values = [e["source_positions"][key] for e in entries if key in e["source_positions"]]
            distinct = list(dict.fromkeys(json.dumps(v, sort_keys=True) for v in values))
            text = distinct[0] if len(distinct) == 1 else f"{distinct[0]} .. {distinct[-1]}"
            tags[f"lineage.{channel}.{key}"] = text[:5000]
    return tags


def log_lineage(
    run: Run,
    config: TrainConfig,
    cursor: Mapping[str, Any],
    *,
    layout: Mapping[str, Any],
    step: int,
) -> dict[str, str]:
    """The commits read, their sources as tags, the rows' schema and layout as artifacts; the
    tags."""
    commits = commits_read(config.location, config.channels, cursor, config.after_commit)
    run.log_dict(commits, "handoff_commits.json")
    tags = lineage_tags(commits)
    run.set_tags(tags)
    reader = ChannelReader(config.location, config.channels[0])
    run.log_dict({f.name: str(f.type) for f in reader.schema}, "schema.json")
    run.log_dict(dict(layout), "layout.json")
    read = [c for entries in commits.values() for c in entries]
    run.log_metrics(
        {"handoff_commits": len(read), "handoff_bytes": sum(c["bytes"] for c in read)}, step=step
    )
    return tags
