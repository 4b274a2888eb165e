"""The scheduler examples run the same command, one run at a time."""

from __future__ import annotations

import yaml

from tests.support import REPO

EXAMPLES = REPO / "examples" / "schedulers"


def test_every_scheduler_example_calls_flow_retrain() -> None:
    for name in ("crontab", "retrain-cronjob.yaml", "airflow_retrain_dag.py"):
        assert "flow" in (EXAMPLES / name).read_text(), name
        assert "retrain pipelines/ctr_backfill.py" in " ".join(
            (EXAMPLES / name).read_text().replace('", "', " ").split()
        ), name


def test_the_cronjob_forbids_concurrent_runs() -> None:
    job = yaml.safe_load((EXAMPLES / "retrain-cronjob.yaml").read_text())
    assert job["kind"] == "CronJob"
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    container = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["flow", "retrain"]
