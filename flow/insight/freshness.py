"""How fresh a channel's rows were when they were committed: per row, from the event (and from
its production to Kafka) to the commit that made it readable.

Read from the shards and commit records (pyarrow, no Spark): a row's ``produced_at`` (the Kafka
record's time, see :data:`flow.pipeline.PRODUCED_AT`) and its event time against its commit's
``committed_at``. The trainer measures the last leg, to training, itself (docs/trainers.md).

Given when each micro-batch of the live stage began and how long it planned (:class:`BatchTimes`,
from the stage's ``batch_started_s`` and ``batch_planning_ms`` metrics, by batch id: a live
channel's commit has its micro-batch's id), produced -> committed is cut into its legs, per row:
waiting for the batch that reads it (the trigger, or the batch before still running), the
batch's planning (offsets, plan, write-ahead log), and its jobs with the commit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flow.handoff.channel import Channel
from flow.handoff.shards import read_shard
from flow.pipeline.sources import PRODUCED_AT

__all__ = ["STEP_LEGS", "BatchTimes", "Freshness", "channel_freshness", "lag_quantiles"]

QUANTILES = (0.5, 0.9, 0.99)

STEP_LEGS = ("step_prepare", "step_checks", "step_job", "step_commit")
"""The legs that split ``jobs_and_commit`` by the batch's steps in its sink (its preparing,
the writer's checks, job and commit: spark_jobs.live.steps); the last is the rest."""


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
    legs: dict[str, dict[str, float]] = field(default_factory=dict)
    """produced -> committed by leg (``waiting``, ``planning``, ``jobs_and_commit``, and of the
    last, where the batch's steps were timed, :data:`STEP_LEGS`): quantiles over the rows of
    the commits whose micro-batch's times were given."""


@dataclass(frozen=True)
class BatchTimes:
    """When a live stage's micro-batch began (epoch seconds), how long it planned, and how long
    each step of its sink took (seconds by step name, spark_jobs.live.steps: Spark's preparing
    it, the writer's checks, job and commit; empty where they were not timed)."""

    started_s: float
    planning_s: float
    steps: Mapping[str, float] = field(default_factory=dict)


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
    batches: Mapping[int, BatchTimes] | None = None,
) -> Freshness:
    """Per-row lags from production and from the event to the commit, over the channel's
    commits (those committed at or after ``since`` only, if given), and produced -> committed
    by leg for the commits in ``batches``. Rows without a ``produced_at`` (table rows) count
    only in the event lag."""
    found = Channel(where, channel)
    result = Freshness(channel)
    produced: list[np.ndarray] = []
    events: list[np.ndarray] = []
    legs: dict[str, list[np.ndarray]] = {
        name: [] for name in ("waiting", "planning", "jobs_and_commit", *STEP_LEGS)
    }
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
                made = _micros(table.column(PRODUCED_AT))
                produced.append((at - made) / 1e6)
                times = (batches or {}).get(batch_id)
                if times is not None:
                    _add_legs(legs, made, times, at)
            if event_time in table.column_names:
                events.append((at - _micros(table.column(event_time))) / 1e6)
        result.commits += 1
    if produced:
        result.produced_to_committed = lag_quantiles(np.concatenate(produced))
    if events:
        result.event_to_committed = lag_quantiles(np.concatenate(events))
    result.legs = {name: lag_quantiles(np.concatenate(v)) for name, v in legs.items() if v}
    return result


def _add_legs(
    legs: dict[str, list[np.ndarray]], produced_us: np.ndarray, times: BatchTimes, committed_us: int
) -> None:
    """A commit's rows' legs: waiting (produced -> its batch began; none for a row its batch
    read as it began), the batch's planning, its jobs and commit (the rest, to the commit); and
    of the last, where the batch's steps were timed, Spark's preparing it, the writer's checks
    and job, and the rest (the writer's commit, and the moments between the steps)."""
    started_us = times.started_s * 1e6
    rows = len(produced_us)
    legs["waiting"].append(np.maximum(started_us - produced_us, 0) / 1e6)
    legs["planning"].append(np.full(rows, times.planning_s))
    jobs = max((committed_us - started_us) / 1e6 - times.planning_s, 0.0)
    legs["jobs_and_commit"].append(np.full(rows, jobs))
    timed = [name for name in ("prepare", "checks", "job") if name in times.steps]
    if len(timed) == 3:
        for name in timed:
            legs[f"step_{name}"].append(np.full(rows, times.steps[name]))
        rest = jobs - sum(times.steps[name] for name in timed)
        legs["step_commit"].append(np.full(rows, max(rest, 0.0)))
