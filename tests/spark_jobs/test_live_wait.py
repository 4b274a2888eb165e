"""A live stage's wait loop and supervisor, on stand-in queries: each batch reported once,
failures classified and retried from the checkpoint with backoff, the query stopped however the
wait ends."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming.query import StreamingQuery

from flow.pipeline.run import RunOptions
from spark_jobs.live.lag import OffsetsUnknownError
from spark_jobs.live.supervise import StreamFailedError, Supervisor, Watch, _await, backoff_s


class StandIn:
    """What the wait loop uses of a StreamingQuery, with progress given up front."""

    def __init__(
        self,
        progress: list[dict[str, Any]],
        *,
        active: bool = True,
        error: str | None = None,
        fails_while_waited: str | None = None,
    ) -> None:
        self.fails_while_waited = fails_while_waited
        self.isActive = active
        self.name = "p.live"
        self.recentProgress = [SimpleNamespace(json=json.dumps(p)) for p in progress]
        self.error = error
        self.stopped = False
        self.busy_polls = 0
        """How many more times ``status`` says a micro-batch is running."""

    @property
    def status(self) -> dict[str, Any]:
        busy = self.busy_polls > 0
        self.busy_polls -= 1
        return {"isTriggerActive": busy, "isDataAvailable": busy, "message": ""}

    def exception(self) -> str | None:
        return self.error

    def awaitTermination(self, timeout: float) -> None:  # noqa: N802 (StreamingQuery's name)
        if self.fails_while_waited:  # as pyspark does for a query that ends with an error
            self.isActive, self.error = False, self.fails_while_waited
            raise StreamingQueryException(message=self.fails_while_waited)

    def stop(self) -> None:
        self.isActive, self.stopped = False, True


def batch(batch_id: int, rows: int, state_rows: int, run: str = "r1") -> dict[str, Any]:
    return {
        "id": "q",
        "runId": run,
        "batchId": batch_id,
        "numInputRows": rows,
        "inputRowsPerSecond": 10.0,
        "processedRowsPerSecond": 20.0,
        "timestamp": "2026-11-28T10:07:30.500Z",
        "durationMs": {
            "triggerExecution": 30,
            "addBatch": 25,
            "latestOffset": 1,
            "queryPlanning": 3,
        },
        "stateOperators": [{"numRowsTotal": state_rows, "numRowsDroppedByWatermark": 0}],
        # Spark's own lag, at planning, says 0; the broker's latest offsets (LATEST) say more.
        "sources": [
            {
                "endOffset": {"ctr.impressions": {"0": 10 * batch_id, "1": 10 * batch_id}},
                "metrics": {"maxOffsetsBehindLatest": "0", "avgOffsetsBehindLatest": "0"},
            }
        ],
        "eventTime": {"max": "2026-11-28T10:07:20.530Z", "watermark": "2026-11-28T10:06:20Z"},
    }


LATEST = {"ctr.impressions": {0: 14, 1: 10}}
"""The broker's latest offsets: batch 0 ended 14 + 10 records behind them, batch 1 4 + 0."""


def wait(
    query: StandIn,
    stop: bool = False,
    options: RunOptions | None = None,
    watch: Watch | None = None,
) -> tuple[Watch, list[tuple[dict[str, float], int]], list[str]]:
    watch = watch or Watch()
    batches: list[tuple[dict[str, float], int]] = []
    said: list[str] = []
    _await(
        cast(StreamingQuery, query),
        options or RunOptions(mode="continuous"),
        watch,
        lambda metrics, step: batches.append((metrics, step)),
        said.append,
        lambda: stop,
        latest=lambda partitions: LATEST,
    )
    return watch, batches, said


def test_each_batch_is_reported_once() -> None:
    query = StandIn([batch(0, 5, 3), batch(1, 2, 4)])
    watch, batches, said = wait(query, stop=True)
    assert [step for _, step in batches] == [0, 1]  # polled in the loop and after it: once each
    assert batches[0][0]["batch_rows_in"] == 5.0
    assert batches[0][0]["batch_sink_ms"] == 25.0
    # What freshness's breakdown reads: the steps before the jobs, and when the batch began.
    assert batches[0][0]["batch_planning_ms"] == 4.0
    assert batches[0][0]["batch_started_s"] == 1795860450.5
    assert (watch.rows_in, watch.state_rows, watch.batches, watch.last_batch) == (7, 4, 2, 1)
    assert said == [
        "batch 0: 5 records in 0.0s; 24 records behind Kafka's latest (at most 14 a partition); "
        "newest event 10.0s old",
        "batch 1: 2 records in 0.0s; 4 records behind Kafka's latest (at most 4 a partition); "
        "newest event 10.0s old",
        "asked to stop; stopping the query",
    ]
    assert query.stopped


def test_the_batchs_steps_join_its_metrics_and_line_once() -> None:
    # The writer timed batch 0's steps (2.4 s of its sink's 2.5 s: Spark prepared it for
    # 0.1 s); batch 1 was a replay it skipped, with no steps.
    watch = Watch(steps={0: {"checks": 0.25, "job": 2.0, "commit": 0.15}})
    sink = batch(0, 5, 3)
    sink["durationMs"]["addBatch"] = 2500
    _, batches, said = wait(StandIn([sink, batch(1, 2, 4)]), stop=True, watch=watch)
    first, second = (metrics for metrics, _ in batches)
    assert first["batch_prepare_ms"] == pytest.approx(100.0)
    assert (first["batch_checks_ms"], first["batch_job_ms"], first["batch_commit_ms"]) == (
        250.0,
        2000.0,
        150.0,
    )
    assert said[0].startswith(
        "batch 0: 5 records in 0.0s (prepare 0.1s, checks 0.2s, job 2.0s, commit 0.1s);"
    )
    assert not [k for k in second if k.startswith(("batch_prepare", "batch_checks", "batch_job"))]
    assert said[1].startswith("batch 1: 2 records in 0.0s;")
    assert watch.steps == {}  # reported once, then let go


def test_lag_is_measured_against_the_brokers_latest_offsets_once_the_batch_is_done() -> None:
    _, batches, _ = wait(StandIn([batch(0, 5, 3), batch(1, 2, 4)]), stop=True)
    first, second = (metrics for metrics, _ in batches)
    assert (first["kafka_lag"], first["kafka_lag_max"], first["kafka_lag_avg"]) == (24, 14, 12)
    assert (second["kafka_lag"], second["kafka_lag_max"], second["kafka_lag_avg"]) == (4, 4, 2)
    # The batch ended at 10:07:30.530 (it started at .500 and took 30 ms); its newest event
    # was of 10:07:20.530.
    assert first["event_time_delay_s"] == pytest.approx(10.0)


def test_a_broker_that_does_not_answer_leaves_the_lag_out_in_one_line() -> None:
    def unknown(partitions: list[tuple[str, int]]) -> dict[str, dict[int, int]]:
        raise OffsetsUnknownError("Kafka at b:9092 did not give its latest offsets (timeout)")

    said: list[str] = []
    batches: list[dict[str, float]] = []
    _await(
        cast(StreamingQuery, StandIn([batch(0, 5, 3)], active=False)),
        RunOptions(),
        Watch(),
        lambda metrics, step: batches.append(metrics),
        said.append,
        lambda: False,
        latest=unknown,
    )
    assert "kafka_lag" not in batches[0]
    assert batches[0]["event_time_delay_s"] == pytest.approx(10.0)
    assert said[0] == (
        "no Kafka lag for this poll's batches: Kafka at b:9092 did not give its latest offsets "
        "(timeout)"
    )


def test_a_failed_query_is_raised_in_one_line_and_stopped() -> None:
    error = (
        "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
        "org.apache.kafka.common.errors.TimeoutException: Timeout of 60000ms expired before "
        "the position for partition ctr.impressions-0 could be determined\n\tat org.apache..."
    )
    query = StandIn([], error=error)
    with pytest.raises(StreamFailedError) as failed:
        wait(query)
    assert failed.value.cause.startswith("org.apache.kafka.common.errors.TimeoutException")
    assert "\n" not in str(failed.value)
    assert failed.value.transient
    assert query.stopped


def test_a_query_that_fails_while_waited_on_is_raised_as_a_stream_failure() -> None:
    error = "[STREAM_FAILED] Query terminated with exception: org.apache.kafka.Unknown: gone"
    query = StandIn([batch(0, 1, 0)], fails_while_waited=error)
    with pytest.raises(StreamFailedError, match=r"org\.apache\.kafka\.Unknown: gone") as failed:
        wait(query)
    assert failed.value.transient


def test_an_error_of_the_pipeline_itself_is_not_transient() -> None:
    error = "terminated with exception: ... flow.errors.SchemaMismatchError: column 'x' ..."
    assert not StreamFailedError.of("stream", error).transient
    assert StreamFailedError.of("stream", "terminated with exception: task failed").transient


def test_the_duration_ends_a_continuous_run() -> None:
    query = StandIn([])
    options = RunOptions(mode="continuous", duration_s=1e-9)
    _, _, said = wait(query, options=options)
    assert said == ["duration of 0s reached; stopping the query"]
    assert query.stopped


def test_a_stop_waits_for_the_running_micro_batch_to_end() -> None:
    # A stop in the middle of a batch could land between its training commit and the commit of
    # its counts: the query is stopped once the batch is done.
    query = StandIn([])
    query.busy_polls = 3
    _, _, said = wait(query, stop=True)
    assert said == ["asked to stop; stopping the query"]
    assert query.stopped
    assert query.busy_polls < 0, "stopped only after the batch ended"


def test_a_query_that_has_caught_up_ends_the_wait_without_a_stop() -> None:
    query = StandIn([batch(0, 1, 0)], active=False)
    _, batches, said = wait(query, options=RunOptions())
    assert [step for _, step in batches] == [0]
    assert said == [
        "batch 0: 1 records in 0.0s; 24 records behind Kafka's latest (at most 14 a "
        "partition); newest event 10.0s old"
    ]
    assert not query.stopped


class Supervised:
    """The supervisor of a stage named ``live`` over stand-in queries: no Spark."""

    def __init__(self, queries: list[StandIn], max_restarts: int) -> None:
        self.options = RunOptions(max_restarts=max_restarts)
        self.queries = queries
        self.said: list[str] = []
        self.slept: list[float] = []
        self.logged: list[tuple[dict[str, float], int]] = []

    def start(self, watch: Watch) -> StreamingQuery:
        return cast(StreamingQuery, self.queries.pop(0))

    def supervise(self, watch: Watch) -> None:
        supervisor = Supervisor(
            "live",
            self.options,
            lambda metrics, step: self.logged.append((metrics, step)),
            self.said.append,
            lambda: False,
            self.slept.append,
        )
        supervisor.run(lambda: self.start(watch), watch)


TIMEOUT = "terminated with exception: org.apache.kafka.common.errors.TimeoutException: broker"


def test_a_failing_query_is_restarted_from_its_checkpoint_with_backoff() -> None:
    run = Supervised(
        [
            StandIn([batch(0, 3, 1)], error=TIMEOUT),
            StandIn([], error=TIMEOUT),
            StandIn([batch(1, 2, 0, run="r3")], active=False),
        ],
        max_restarts=5,
    )
    watch = Watch()
    run.supervise(watch)
    assert watch.restarts == 2
    assert run.slept == [backoff_s(1), backoff_s(2)] == [2.0, 4.0]
    said = [line for line in run.said if not line.startswith("batch ")]
    assert len(said) == 2
    assert said[0].startswith("live: the query failed (org.apache.kafka.common.errors.")
    assert "restart 1/5 from its checkpoint in 2s" in said[0]
    assert [m for m, _ in run.logged if "restarts" in m] == [{"restarts": 1.0}, {"restarts": 2.0}]
    assert watch.batches == 2  # batches of every run of the query, each once


def test_the_supervisor_gives_up_after_its_bound_with_one_line() -> None:
    run = Supervised([StandIn([], error=TIMEOUT) for _ in range(3)], max_restarts=2)
    with pytest.raises(StreamFailedError, match=r"gave up after 2 restart\(s\)") as failed:
        run.supervise(Watch())
    assert "\n" not in str(failed.value)
    assert run.slept == [2.0, 4.0]


def test_the_supervisor_does_not_retry_an_error_of_the_pipeline() -> None:
    error = "terminated with exception: flow.errors.ConfigError: column 'price' is missing"
    run = Supervised([StandIn([], error=error)], max_restarts=5)
    with pytest.raises(StreamFailedError, match="column 'price' is missing"):
        run.supervise(Watch())
    assert run.slept == []


def test_backoff_doubles_to_a_minute() -> None:
    assert [backoff_s(n) for n in (1, 2, 3, 5, 6, 10)] == [2.0, 4.0, 8.0, 32.0, 60.0, 60.0]


VAGUE = (
    "[STREAM_FAILED] Query terminated with exception: [FOREACH_BATCH_USER_FUNCTION_ERROR] An "
    "error occurred in the user provided function in foreach batch sink. Reason: An exception "
    "was raised by the Python Proxy. Return Message: Traceback (most recent call last):"
)


def test_a_full_disk_stops_the_stage_at_once_naming_the_cause_and_what_to_change() -> None:
    full = VAGUE + "\n  File 'x.py', line 1\nOSError: [Errno 28] No space left on device\n"
    run = Supervised([StandIn([], error=full)], max_restarts=5)
    with pytest.raises(StreamFailedError) as failed:
        run.supervise(Watch())
    message = str(failed.value)
    assert message.startswith("live stage 'live' stopped, not restarted: OSError: [Errno 28] No")
    assert "free space where the stage writes" in message
    assert "\n" not in message
    assert run.slept == []


def test_the_batch_functions_own_exception_names_the_cause_spark_hides() -> None:
    class Refusing(Supervised):
        def start(self, watch: Watch) -> StreamingQuery:
            query = super().start(watch)
            # As recording does when the batch function raises on the driver.
            watch.batch_error = PermissionError(13, "Permission denied", "/h/live/commits/7")
            return query

    run = Refusing([StandIn([], error=VAGUE)], max_restarts=5)
    with pytest.raises(StreamFailedError, match=r"PermissionError: \[Errno 13\] Permission"):
        run.supervise(Watch())
    assert run.slept == []


def test_the_duration_counts_from_the_first_start_not_from_each_restart() -> None:
    run = Supervised([StandIn([], error=TIMEOUT) for _ in range(3)], max_restarts=5)
    run.options = RunOptions(mode="continuous", max_restarts=5, duration_s=1e-9)
    with pytest.raises(StreamFailedError, match=r"--duration of 0s ran out, after 0 restart"):
        run.supervise(Watch())
    assert run.slept == []
    assert len(run.queries) == 2, "not started again once the duration was spent"
