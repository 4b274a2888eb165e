"""A channel's freshness at commit time, read from its shards and commit records."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from flow.handoff import Channel
from flow.handoff.format import Commit
from flow.insight.freshness import BatchTimes, channel_freshness, lag_quantiles

TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([("label", pa.float32()), ("ts", TS), ("produced_at", TS)])


def _channel(tmp_path: Path) -> datetime:
    """Two commits, a minute apart, of rows produced 1, 2, 3 and 10 s before their commit."""
    channel = Channel(str(tmp_path), "live")
    channel.create(SCHEMA, num_buckets=1)
    committed = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    batches: list[list[float | None]] = [[1.0, 2.0, 3.0], [10.0, None]]
    for batch, lags in enumerate(batches):
        at = committed + timedelta(minutes=batch)
        rows = pa.table(
            {
                "label": [1.0, 0.0, 0.0][: len(lags)],
                "ts": [at - timedelta(seconds=60 + (lag or 0)) for lag in lags],
                # A table row (a backfill's) has no production time.
                "produced_at": [
                    None if lag is None else at - timedelta(seconds=lag) for lag in lags
                ],
            },
            schema=SCHEMA,
        )
        shard = channel.write_bucket(batch, 0, rows, "t0")
        channel.add_commit(
            Commit("live", batch, (shard,), channel.meta().fingerprint, committed_at=at.isoformat())
        )
    return committed


def test_lags_run_from_production_and_from_the_event_to_each_rows_commit(tmp_path: Path) -> None:
    committed = _channel(tmp_path)
    found = channel_freshness(str(tmp_path), "live")
    assert (found.rows, found.commits, found.positives) == (5, 2, 2)
    assert found.produced_to_committed["max"] == 10.0
    assert found.produced_to_committed["p50"] == 2.5  # of 1, 2, 3, 10
    assert found.event_to_committed["p50"] == 62.0  # of 61, 62, 63, 70, 60
    later = channel_freshness(str(tmp_path), "live", since=committed + timedelta(seconds=30))
    assert (later.rows, later.produced_to_committed["max"]) == (2, 10.0)


def test_no_lags_without_rows() -> None:
    assert lag_quantiles(np.array([])) == {}


def test_produced_to_committed_is_cut_into_legs_by_the_micro_batches_times(tmp_path: Path) -> None:
    committed = _channel(tmp_path)
    # Batch 0 began 2.5 s before its commit and planned 0.5 s: rows produced 1 and 2 s before
    # the commit were read as it began (no wait), the one 3 s before waited 0.5 s. Batch 1's
    # times are unknown: its rows count in no leg.
    started = committed.timestamp() - 2.5
    found = channel_freshness(
        str(tmp_path), "live", batches={0: BatchTimes(started_s=started, planning_s=0.5)}
    )
    assert found.legs["waiting"]["max"] == 0.5
    assert found.legs["waiting"]["p50"] == 0.0
    assert found.legs["planning"]["p50"] == 0.5
    assert found.legs["jobs_and_commit"]["p99"] == 2.0
    assert found.produced_to_committed["max"] == 10.0  # every commit still counts here
    assert not {"step_prepare", "step_checks", "step_job", "step_commit"} & set(found.legs)


def test_the_batchs_jobs_and_commit_are_split_by_its_steps(tmp_path: Path) -> None:
    committed = _channel(tmp_path)
    # Batch 0: 2.5 s from its start to its commit, 0.5 s of it planning; Spark prepared it for
    # 0.5 s, the writer spent 0.25 s on its checks and 1 s on its job, so 0.25 s went to the
    # rest, the commit.
    started = committed.timestamp() - 2.5
    steps = {"prepare": 0.5, "checks": 0.25, "job": 1.0, "commit": 0.2}
    times = BatchTimes(started_s=started, planning_s=0.5, steps=steps)
    found = channel_freshness(str(tmp_path), "live", batches={0: times})
    assert found.legs["jobs_and_commit"]["p50"] == 2.0
    assert found.legs["step_prepare"]["p50"] == 0.5
    assert found.legs["step_checks"]["p50"] == 0.25
    assert found.legs["step_job"]["p50"] == 1.0
    assert found.legs["step_commit"]["p50"] == pytest.approx(0.25)
