"""Nested MLflow runs through the local server land in its SQLite store."""

from __future__ import annotations

import uuid

import pytest
from mlflow.tracking import MlflowClient

from flow.config import StackConfig
from flow.tracking import MlflowTracker, NullTracker, ResilientRun


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


def test_the_null_tracker_records_nothing_but_accepts_everything() -> None:
    tracker = NullTracker()
    with tracker.pipeline_run("p", params={"a": 1}) as run, tracker.stage("s") as stage:
        stage.log_metrics({"x": 1.0})
        stage.log_dict({"a": 1}, "a.json")
        run.set_tags({"t": "v"})
    assert run.run_id == "untracked"


class _FlakyRun:
    """A run whose server is down until ``up`` is set."""

    run_id = "flaky"

    def __init__(self) -> None:
        self.up = False
        self.logged: list[dict[str, float]] = []

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if not self.up:
            raise ConnectionError("connection refused")
        self.logged.append(metrics)


def test_a_tracking_outage_is_reported_once_and_its_calls_retried_in_order() -> None:
    flaky = _FlakyRun()
    said: list[str] = []
    run = ResilientRun(flaky, said.append, retry_after=0.0)  # type: ignore[arg-type]
    run.log_metrics({"a": 1})
    run.log_metrics({"a": 2})
    assert flaky.logged == []
    assert len(run.pending) == 2
    assert len(said) == 1
    assert "connection refused" in said[0]
    flaky.up = True
    run.log_metrics({"a": 3})
    assert flaky.logged == [{"a": 1}, {"a": 2}, {"a": 3}]
    assert "back" in said[-1]
