from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.pipeline.smoke import SmokeCheck
from pipelines.smoke import smoke
from tests.support import run_flow


def test_the_smoke_definition_is_valid_and_bad_values_name_the_field() -> None:
    assert smoke().events > 0
    with pytest.raises(ConfigError, match=r"SmokeCheck.events=0"):
        SmokeCheck(events=0)
    with pytest.raises(ConfigError, match=r"SmokeCheck.topic='bad topic'"):
        SmokeCheck(topic="bad topic")
    with pytest.raises(ConfigError, match=r"SmokeCheck.namespace='Smoke-1'"):
        SmokeCheck(namespace="Smoke-1")


@pytest.mark.integration
def test_flow_run_smoke_reconciles_and_is_tracked_in_mlflow(
    running_stack: StackConfig, stack_env: dict[str, str]
) -> None:
    args = ["run", "--json", "pipelines/smoke.py", "--events", "300", "--users", "10"]
    done = run_flow(args, stack_env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    # --json: spark-submit's output (the app's stdout and stderr merged) goes to stderr, and
    # stdout holds one object; a file that is not a pipeline has no stages in it.
    assert "counts reconcile" in done.stderr
    outcome = json.loads(done.stdout)
    assert (outcome["app"], outcome["exit_code"], outcome["stages"]) == (
        "pipelines/smoke.py",
        0,
        None,
    )

    client = MlflowClient(tracking_uri=running_stack.mlflow.tracking_uri)
    experiment = client.get_experiment_by_name("primus-flow-smoke")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id], order_by=["start_time DESC"])
    parent = next(r for r in runs if r.info.run_name == "smoke")
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["reconciled"] == 1.0
    stages = {
        r.info.run_name: r
        for r in runs
        if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
    }
    assert set(stages) == {
        "iceberg-dimensions",
        "kafka-produce",
        "spark-stream",
        "delta-merge",
        "verify",
    }
    assert stages["kafka-produce"].data.metrics["rows_out"] == 300
    assert stages["spark-stream"].data.metrics["rows_out"] == 300
    assert stages["delta-merge"].data.metrics["rows_out"] == 300
    assert stages["iceberg-dimensions"].data.tags["iceberg.users.snapshot_id"]
    assert "smoke.events" in stages["spark-stream"].data.tags["kafka.end_offsets"]
