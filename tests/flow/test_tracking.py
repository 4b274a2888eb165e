"""Nested MLflow runs through the local server land in its SQLite store; logging through a
ResilientRun never waits on the server and outlives its outages."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from flow import stack as services
from flow.config import StackConfig
from flow.console import Terminated
from flow.errors import ServiceError
from flow.tracking import (
    CLIENT_LIMITS,
    MetricPoint,
    MlflowTracker,
    NullTracker,
    ResilientRun,
    bound_client_calls,
)
from flow.tracking.mlflow_tracker import unreachable
from tests.support import free_ports


def _failing_stage(tracker: MlflowTracker) -> None:
    with tracker.stage("write") as write:
        write.log_metrics({"rows_out": 3})
        raise RuntimeError("disk full")


@pytest.mark.integration
def test_nested_runs_land_in_the_sqlite_store(running_stack: StackConfig) -> None:
    experiment = f"test-tracking-{uuid.uuid4().hex[:8]}"
    tracker = MlflowTracker(running_stack.mlflow.tracking_uri, experiment)
    with tracker.pipeline_run(
        "pipeline", params={"rows": 10}, tags={"flow.run_tag": "t1"}
    ) as parent:
        with tracker.stage("read") as read:
            read.log_metrics({"rows_out": 10})
        with pytest.raises(RuntimeError, match="disk full"):
            _failing_stage(tracker)

    # Read the store directly, not through the server that wrote it.
    store = MlflowClient(tracking_uri=f"sqlite:///{running_stack.mlflow.backend_store}")
    exp = store.get_experiment_by_name(experiment)
    assert exp is not None
    runs = {r.info.run_name: r for r in store.search_runs([exp.experiment_id])}
    assert set(runs) == {"pipeline", "read", "write"}
    assert runs["pipeline"].info.status == "FINISHED"
    assert runs["pipeline"].data.params["rows"] == "10"
    assert "version.pyiceberg" in runs["pipeline"].data.params
    for stage in ("read", "write"):
        assert runs[stage].data.tags["mlflow.parentRunId"] == parent.run_id
        assert runs[stage].data.tags["flow.stage"] == stage
    assert runs["read"].data.metrics["rows_out"] == 10
    assert runs["read"].data.metrics["duration_s"] >= 0
    assert runs["read"].info.status == "FINISHED"
    assert runs["write"].info.status == "FAILED"


@pytest.mark.integration
@pytest.mark.faults
def test_metrics_logged_while_the_server_is_stopped_arrive_when_it_is_back(
    running_stack: StackConfig,
) -> None:
    uri = running_stack.mlflow.tracking_uri
    tracker = MlflowTracker(uri, f"test-outage-{uuid.uuid4().hex[:8]}")
    said: list[str] = []
    with tracker.stage("train") as stage, ResilientRun(stage, said.append, retry_after=1) as run:
        for step in range(5):
            run.log_metrics({"loss": 1 / (step + 1)}, step=step)
        assert run.flush(timeout=60)
        services.down(running_stack, ("mlflow",))
        try:
            for step in range(5, 105):
                run.log_metrics({"loss": 1 / (step + 1)}, step=step)
                time.sleep(0.01)
            run.set_tags({"during": "the outage"})
            # Every call returned with the server down: they wait in the queue, none was lost.
            assert run.pending == 101, run.pending
            _wait_until(lambda: any("unreachable" in m for m in said), timeout=120)
        finally:
            (row,) = services.up(running_stack, ("mlflow",))
        assert row.healthy, row
        assert run.flush(timeout=120)
    client = MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(stage.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(s, 1 / (s + 1)) for s in range(105)]
    assert client.get_run(stage.run_id).data.tags["during"] == "the outage"
    down = [m for m in said if " unreachable since " in m]
    back = [m for m in said if " back after " in m]
    assert len(down) == len(back) == 1, said
    assert down[0].startswith(f"MLflow at {uri} unreachable since ")
    assert back[0].endswith("; 101 calls sent"), back


def test_the_null_tracker_records_nothing_but_accepts_everything() -> None:
    tracker = NullTracker()
    with tracker.pipeline_run("p", params={"a": 1}) as run, tracker.stage("s") as stage:
        stage.log_metrics({"x": 1.0})
        stage.log_dict({"a": 1}, "a.json")
        run.set_tags({"t": "v"})
    assert run.run_id == "untracked"


class _RefusedError(Exception):
    """What MLflow raises for a call its server refuses (HTTP 400)."""

    def get_http_status_code(self) -> int:
        return 400


class _FakeRun:
    """A run on a fake tracking server: while it is down, each request waits ``hang`` seconds
    and fails, as the MLflow client does against a dead or hung server. A metric named "bad"
    is refused, as MLflow refuses a bad value."""

    tracking_uri = "http://tracking.test:5000"

    def __init__(self, hang: float = 0.0) -> None:
        self.run_id = uuid.uuid4().hex
        self.hang = hang
        self.up = threading.Event()
        self.up.set()
        self.points: list[MetricPoint] = []
        self.calls: list[tuple[str, Any]] = []
        self.requests = 0
        self.failures = 0

    def _serve(self) -> None:
        self.requests += 1
        if not self.up.is_set():
            self.failures += 1
            self.up.wait(self.hang)
            raise ConnectionError("connection refused")

    def log_points(self, points: Sequence[MetricPoint]) -> None:
        self._serve()
        if any(p.key == "bad" for p in points):
            raise _RefusedError("INVALID_PARAMETER_VALUE: bad")
        self.points.extend(points)
        self.calls.append(("metrics", [p.step for p in points]))

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        raise AssertionError("metrics go through log_points")

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._serve()
        self.calls.append(("params", dict(params)))

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._serve()
        self.calls.append(("tags", dict(tags)))

    def log_dict(self, data: Any, artifact_file: str) -> None:
        self._serve()
        self.calls.append(("dict", artifact_file))


def _wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_logging_during_an_outage_returns_at_once_and_arrives_in_order_after_it() -> None:
    server = _FakeRun(hang=0.5)  # each request to the dead server takes 0.5 s to fail
    said: list[str] = []
    run = ResilientRun(server, said.append, retry_after=0.2)
    server.up.clear()
    spent = 0.0
    logged: list[tuple[float, float]] = []
    outage_started = time.monotonic()
    for step in range(200):  # about 2 s of training while the server is down
        before = time.time() * 1000
        started = time.perf_counter()
        run.log_metrics({"loss": 1 / (step + 1), "samples_per_s": 1000.0}, step=step)
        spent += time.perf_counter() - started
        logged.append((before, time.time() * 1000))
        time.sleep(0.01)
    outage = time.monotonic() - outage_started
    assert server.failures >= 2, "the thread retried while the server was down"
    assert spent < 0.5 < outage, f"{spent:.3f} s in 200 calls during a {outage:.1f} s outage"
    assert run.pending == 200
    assert server.points == []
    server.up.set()
    assert run.flush(timeout=30)
    assert run.pending == 0
    losses = [p for p in server.points if p.key == "loss"]
    assert [p.step for p in losses] == list(range(200))
    assert [p.value for p in losses] == [1 / (s + 1) for s in range(200)]
    for point, (before, after) in zip(losses, logged, strict=True):
        assert int(before) - 1 <= point.timestamp_ms <= after + 1, "the time it was logged at"
    assert len(server.calls) <= 5, "the backlog goes in a few requests (up to 1000 points each)"
    down = [m for m in said if "unreachable" in m]
    back = [m for m in said if " back after " in m]
    assert len(down) == 1, said
    assert down[0].startswith("MLflow at http://tracking.test:5000 unreachable since ")
    assert "connection refused" in down[0]
    assert back == [
        f"MLflow at http://tracking.test:5000 back after {back[0].split()[5]} s; 200 calls sent"
    ], said
    assert float(back[0].split()[5]) >= 1
    assert len(said) == 2, said
    run.close()


def test_calls_of_every_kind_keep_their_order_over_an_outage() -> None:
    server = _FakeRun()
    said: list[str] = []
    with ResilientRun(server, said.append, retry_after=60) as run:
        run.log_params({"lr": 0.1})
        assert run.flush(timeout=10)
        server.up.clear()
        run.log_metrics({"a": 1}, step=1)
        run.log_metrics({"a": 2}, step=2)
        run.set_tags({"t": "v"})
        run.log_metrics({"a": 3}, step=3)
        run.log_dict({"k": 1}, "k.json")
        run.log_metrics({"a": 4})
        _wait_until(lambda: any("unreachable" in m for m in said))
        server.up.set()
        assert run.flush(timeout=10)  # retried now, not in 60 s
    assert server.calls == [
        ("params", {"lr": 0.1}),
        ("metrics", [1, 2]),
        ("tags", {"t": "v"}),
        ("metrics", [3]),
        ("dict", "k.json"),
        ("metrics", [0]),  # no step: step 0, as MLflow has it
    ]
    assert run.sent == 7
    assert [m.split()[3] for m in said] == ["unreachable", "back"]


def test_calls_that_come_fast_share_requests_and_a_flush_sends_at_once() -> None:
    server = _FakeRun()
    with ResilientRun(server, lambda _: None, send_every=60) as run:
        for step in range(100):
            run.log_metrics({"a": step}, step=step)
        run.set_tags({"t": "v"})
        run.log_metrics({"a": 100}, step=100)
        assert run.flush(timeout=10)  # not a minute per request
    assert [p.step for p in server.points] == list(range(101))
    assert len(server.calls) <= 4, server.calls  # 1 alone, 2..99 together, the tag, 100


def test_beyond_the_bound_the_oldest_calls_are_dropped_counted_and_reported() -> None:
    server = _FakeRun()
    server.up.clear()
    said: list[str] = []
    run = ResilientRun(server, said.append, retry_after=60, max_pending=10)
    for step in range(25):
        run.log_metrics({"a": step}, step=step)
    # The call being sent when the others came, if any, is the oldest when it fails.
    _wait_until(lambda: run.pending == 10)
    assert run.dropped == 15
    server.up.set()
    assert run.flush(timeout=10)
    assert [p.step for p in server.points] == list(range(15, 25))
    assert len([m for m in said if "dropping the oldest" in m]) == 1, said
    assert "more than 10 calls queued" in said[0] or "more than 10 calls queued" in said[1]
    run.close()


def test_flush_waits_at_most_its_timeout_and_says_what_is_left() -> None:
    server = _FakeRun()
    server.up.clear()
    said: list[str] = []
    run = ResilientRun(server, said.append, retry_after=60)
    run.log_metrics({"a": 1}, step=1)
    started = time.monotonic()
    assert not run.flush(timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 10
    assert said[-1].startswith(
        "MLflow at http://tracking.test:5000: 1 calls still queued after 0.3 s"
    )
    assert "unreachable since" in said[-1]
    server.up.set()
    assert run.close(timeout=10)
    assert [p.step for p in server.points] == [1]


def test_close_stops_the_thread_and_a_later_call_starts_it_again() -> None:
    server = _FakeRun()
    run = ResilientRun(server, lambda _: None)

    name = f"tracking-{server.run_id[:8]}"

    def threads() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name == name]

    assert threads() == []  # started by the first call
    run.log_metrics({"a": 1}, step=1)
    assert threads() == [name]
    assert run.close(timeout=10)
    assert threads() == []
    run.log_metrics({"a": 2}, step=2)
    assert run.close(timeout=10)
    assert [p.step for p in server.points] == [1, 2]
    assert threads() == []


def test_a_refused_call_is_dropped_and_reported_and_the_others_still_go() -> None:
    server = _FakeRun()
    server.up.clear()
    said: list[str] = []
    with ResilientRun(server, said.append, retry_after=60) as run:
        run.log_metrics({"a": 1}, step=1)
        run.log_metrics({"bad": 1}, step=2)  # merged with its neighbours, then refused
        run.log_metrics({"a": 3}, step=3)
        server.up.set()
        assert run.flush(timeout=10)
    assert [p.step for p in server.points] == [1, 3]
    assert run.rejected == 1
    (refused,) = [m for m in said if " refused log_metrics" in m]
    assert refused.startswith(
        "MLflow at http://tracking.test:5000 refused log_metrics (_RefusedError:"
    )


class _PlainRun:
    """A run without ``log_points``: its metric calls are sent one by one."""

    run_id = "plain"

    def __init__(self) -> None:
        self.up = True
        self.logged: list[tuple[dict[str, float], int | None]] = []

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if not self.up:
            raise ConnectionError("connection refused")
        self.logged.append((metrics, step))


def test_a_run_without_points_gets_each_metric_call_as_it_was_made() -> None:
    plain = _PlainRun()
    plain.up = False
    said: list[str] = []
    with ResilientRun(plain, said.append, retry_after=60) as run:  # type: ignore[arg-type]
        run.log_metrics({"a": 1}, step=5)
        run.log_metrics({"a": 2})
        _wait_until(lambda: len(said) == 1)
        assert "MLflow at its tracking server unreachable since" in said[0]
        plain.up = True
    assert plain.logged == [({"a": 1.0}, 5), ({"a": 2.0}, None)]


def test_the_tracker_bounds_its_client_calls_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in CLIENT_LIMITS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "42")
    bound_client_calls()
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "42"  # the user's own stays
    assert (
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]
        == CLIENT_LIMITS["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]
    )


def test_with_the_bounds_a_call_to_a_dead_server_fails_in_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MLflow's own defaults retry a refused call for about 4 minutes."""
    from mlflow.entities import Metric
    from mlflow.exceptions import MlflowException

    for name, value in CLIENT_LIMITS.items():
        monkeypatch.setenv(name, value)
    (port,) = free_ports(1)
    client = MlflowClient(tracking_uri=f"http://127.0.0.1:{port}")
    started = time.monotonic()
    with pytest.raises(MlflowException, match=r"Connection refused|Max retries"):
        client.log_batch("0" * 32, metrics=[Metric("a", 1.0, 0, 0)])
    assert time.monotonic() - started < 30


def test_a_tracker_whose_server_is_down_says_so_in_one_line_before_any_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in CLIENT_LIMITS.items():
        monkeypatch.setenv(name, value)
    (port,) = free_ports(1)
    tracker = MlflowTracker(f"http://127.0.0.1:{port}", "nowhere")
    with pytest.raises(ServiceError) as failed:
        tracker.check()
    message = str(failed.value)
    assert message == (
        f"the MLflow tracking server at http://127.0.0.1:{port} cannot be reached (connection "
        "refused): start it (`flow services up`), set MLFLOW_TRACKING_URI to yours, or run "
        "without tracking (--no-tracking)"
    )
    assert unreachable(ValueError("a bug")) is None


@pytest.mark.integration
def test_a_stopped_stage_ends_killed_and_a_failed_one_failed(running_stack: StackConfig) -> None:
    experiment = f"test-stopped-{uuid.uuid4().hex[:8]}"
    tracker = MlflowTracker(running_stack.mlflow.tracking_uri, experiment)
    with pytest.raises(Terminated), tracker.pipeline_run("pipeline"), tracker.stage("live"):
        raise Terminated("SIGTERM received")  # as flow.console.terminating_as_interrupt does
    store = MlflowClient(tracking_uri=f"sqlite:///{running_stack.mlflow.backend_store}")
    exp = store.get_experiment_by_name(experiment)
    assert exp is not None
    runs = {r.info.run_name: r.info.status for r in store.search_runs([exp.experiment_id])}
    assert runs == {"pipeline": "KILLED", "live": "KILLED"}
