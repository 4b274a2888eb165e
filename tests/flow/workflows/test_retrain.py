"""Scheduled retraining's unit: incremental, nothing new twice, a worse model not promoted."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from flow.config import StackConfig
from flow.workflows.retrain import EXIT_CODES
from tests.support import run_flow

PIPELINE = """
from flow.pipeline import run_main
from pipelines.ctr_backfill import ctr_backfill


def retrain_ctr():
    return ctr_backfill("{namespace}")


if __name__ == "__main__":
    run_main(retrain_ctr())
"""


@pytest.mark.integration
def test_retraining_is_incremental_and_promotes_only_a_model_that_is_not_worse(
    running_stack: StackConfig, stack_env: dict[str, str], tmp_path: Path
) -> None:
    namespace = f"rt{uuid.uuid4().hex[:6]}"
    app = tmp_path / "retrain_ctr.py"
    app.write_text(PIPELINE.format(namespace=namespace))
    name = f"ctr-{namespace}"
    history = ["generate", "history", "--namespace", namespace, "--days", "1", "--per-day", "4000"]
    quick = "--batch-size 256 --epochs 2 --lr 0.01"

    def retrain(train: str, outcome: str) -> str:
        done = run_flow(["retrain", str(app), "--model-name", name, "--train", train], stack_env)
        said = done.stdout[-3000:] + done.stderr[-3000:]
        assert done.returncode == EXIT_CODES[outcome], said  # one exit code per outcome
        assert f"retrain {name}: {outcome}" in done.stdout, said  # the result on stdout
        return done.stdout + done.stderr

    assert run_flow(history, stack_env).returncode == 0
    assert "promoted (no champion yet)" in retrain(quick, "promoted")
    retrain(quick, "nothing-new")  # no new snapshot: nothing is trained

    assert run_flow([*history, "--append"], stack_env).returncode == 0
    worse = retrain("--batch-size 256 --epochs 1 --lr 50", "kept")
    assert "kept" in worse
    assert "below the champion's" in worse

    client = MlflowClient(tracking_uri=running_stack.mlflow.tracking_uri)
    assert client.get_model_version_by_alias(name, "champion").version == "1"
    # Each version says what it read (the retraining read only the new commit) and its fate.
    first, second = (client.get_model_version(name, v).tags for v in ("1", "2"))
    assert (first["flow.commits.backfill"], second["flow.commits.backfill"]) == ("0..0", "1..1")
    assert (first["flow.promotion"], second["flow.promotion"]) == ("promoted", "kept")
    assert "below the champion's" in second["flow.promotion.reason"]
    assert first["flow.feature_state"] == second["flow.feature_state"]  # the champion's state
    assert first["flow.inputs"] == second["flow.inputs"] == "raw"
    experiment = client.get_experiment_by_name("retrain-ctr_backfill")
    assert experiment is not None
    runs = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"params.model = '{name}'",
        order_by=["attributes.start_time ASC"],
    )
    assert [r.data.tags["flow.retrain.outcome"] for r in runs] == [
        "promoted",
        "nothing-new",
        "kept",
    ]
