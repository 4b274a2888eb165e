"""A live stage's wait loop, on stand-in queries: each batch reported once, failures raised with
the query's role, every query stopped however the wait ends."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pyspark.sql.streaming.query import StreamingQuery

from flow.pipeline.run import RunOptions
from spark_jobs.live import StreamFailedError, _await, _Watch


class StandIn:
    """What the wait loop uses of a StreamingQuery, with progress given up front."""

    def __init__(self, progress: list[dict[str, Any]], *, active: bool = True) -> None:
        self.isActive = active
        self.recentProgress = [SimpleNamespace(json=json.dumps(p)) for p in progress]
        self.error: str | None = None
        self.stopped = False

    def exception(self) -> str | None:
        return self.error

    def awaitTermination(self, timeout: float) -> None:  # noqa: N802 (StreamingQuery's name)
        pass

    def stop(self) -> None:
        self.isActive, self.stopped = False, True


def batch(batch_id: int, rows: int, state_rows: int, late: int) -> dict[str, Any]:
    return {
        "id": "q",
        "batchId": batch_id,
        "numInputRows": rows,
        "inputRowsPerSecond": 10.0,
        "processedRowsPerSecond": 20.0,
        "durationMs": {"triggerExecution": 30, "addBatch": 25},
        "stateOperators": [{"numRowsTotal": state_rows, "numRowsDroppedByWatermark": late}],
        "sources": [{"metrics": {"maxOffsetsBehindLatest": "4", "avgOffsetsBehindLatest": "2"}}],
    }


def wait(
    queries: dict[str, StandIn], stop: bool = False, options: RunOptions | None = None
) -> tuple[_Watch, list[tuple[dict[str, float], int]], list[str]]:
    watch = _Watch()
    batches: list[tuple[dict[str, float], int]] = []
    said: list[str] = []
    _await(
        cast(dict[str, StreamingQuery], queries),
        options or RunOptions(mode="continuous"),
        watch,
        lambda metrics, step: batches.append((metrics, step)),
        said.append,
        lambda: stop,
    )
    return watch, batches, said


def test_each_main_batch_is_reported_once_and_intake_batches_not_at_all() -> None:
    intake = StandIn([batch(0, 9, 0, 0)])
    main = StandIn([batch(0, 5, 3, 1), batch(1, 2, 4, 0)])
    watch, batches, said = wait({"intake": intake, "main": main}, stop=True)
    assert [step for _, step in batches] == [0, 1]  # polled in the loop and after it: once each
    assert batches[0][0]["batch_rows_in"] == 5.0
    assert batches[0][0]["batch_sink_ms"] == 25.0
    assert batches[0][0]["kafka_lag_max"] == 4.0
    assert (watch.rows_in, watch.late_dropped, watch.state_rows, watch.batches) == (7, 1, 4, 2)
    assert said == ["asked to stop; stopping the queries"]
    assert intake.stopped
    assert main.stopped


def test_a_failed_query_is_raised_with_its_role_and_the_others_are_stopped() -> None:
    intake, main = StandIn([]), StandIn([])
    main.error = "broker gone"
    with pytest.raises(StreamFailedError, match="the main query failed: broker gone"):
        wait({"intake": intake, "main": main})
    assert intake.stopped
    assert main.stopped


def test_the_duration_ends_a_continuous_run() -> None:
    queries = {"intake": StandIn([]), "main": StandIn([])}
    options = RunOptions(mode="continuous", duration_s=1e-9)
    _, _, said = wait(queries, options=options)
    assert said == ["duration of 0s reached; stopping the queries"]
    assert all(q.stopped for q in queries.values())


def test_queries_that_have_caught_up_end_the_wait_without_a_stop() -> None:
    queries = {
        "intake": StandIn([], active=False),
        "main": StandIn([batch(0, 1, 0, 0)], active=False),
    }
    _, batches, said = wait(queries, options=RunOptions())
    assert [step for _, step in batches] == [0]
    assert said == []
    assert not any(q.stopped for q in queries.values())
