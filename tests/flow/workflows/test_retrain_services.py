"""``flow retrain`` starts only the services a retraining uses, and never one the settings
point elsewhere (a scheduler's worker configured for remote MLflow and Kafka)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from flow.cli import main
from flow.config import ENV_VARS
from flow.stack import process
from flow.workflows import retrain as workflow
from flow.workflows.retrain import RetrainOutcome, load_pipeline, services_needed
from tests.support import REPO, stack_env_for


class StartedError(Exception):
    """A service process was about to start."""


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # nothing listens once the socket closes


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """The commands of service processes flow tried to start (none is started: the first
    attempt raises ``StartedError``); the retraining itself ends at once with ``nothing-new``."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in stack_env_for(tmp_path / "home").items():
        monkeypatch.setenv(name, value)
    tried: list[str] = []

    def spawn(command: list[str], *args: object, **kwargs: object) -> None:
        tried.append(" ".join(command))
        raise StartedError(tried[-1])

    monkeypatch.setattr(process, "spawn", spawn)
    monkeypatch.setattr(
        workflow, "retrain", lambda *a, **k: RetrainOutcome("nothing-new", "test", 1, "")
    )
    monkeypatch.chdir(REPO)
    return tried


def test_a_retraining_needs_the_catalog_and_mlflow_and_kafka_only_for_kafka_sources() -> None:
    assert services_needed(load_pipeline("pipelines/ctr_backfill.py")) == ("iceberg", "mlflow")
    assert services_needed(load_pipeline("pipelines/ctr_streaming.py"))[0] == "kafka"


def test_external_mlflow_and_kafka_are_never_started(
    started: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("FLOW_KAFKA_BOOTSTRAP", f"127.0.0.1:{_closed_port()}")
    result = CliRunner().invoke(main, ["retrain", "pipelines/ctr_backfill.py"])
    assert started == []
    assert result.exit_code == 4, result.output


def test_external_mlflow_alone_starts_no_local_broker(
    started: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{_closed_port()}")
    result = CliRunner().invoke(main, ["retrain", "pipelines/ctr_backfill.py"])
    assert started == []  # Kafka is left alone: the backfill reads Iceberg
    assert result.exit_code == 4, result.output


def test_without_external_settings_the_local_mlflow_is_started(started: list[str]) -> None:
    # The contrast that shows the probe works: the development default starts MLflow, and
    # still no broker.
    result = CliRunner().invoke(main, ["retrain", "pipelines/ctr_backfill.py"])
    assert len(started) == 1
    assert "mlflow" in started[0]
    assert "kafka" not in started[0].lower()
    assert isinstance(result.exception, StartedError)


def test_a_pipeline_file_is_built_for_the_namespace_asked_when_it_takes_one(
    tmp_path: Path,
) -> None:
    """flow demo runs pipelines/ctr_demo.py with --namespace demo: `flow check consistency demo
    backfill` builds it for `demo`, where it called it as is and found namespace `ctr`."""
    assert load_pipeline("pipelines/ctr_demo.py").namespace == "ctr"
    assert load_pipeline("pipelines/ctr_demo.py", "demo").namespace == "demo"
    fixed = tmp_path / "fixed.py"
    fixed.write_text(
        "from pipelines.ctr_backfill import ctr_backfill\n\n"
        "def fixed():\n    return ctr_backfill('elsewhere')\n"
    )
    assert load_pipeline(str(fixed), "demo").namespace == "elsewhere"  # takes none: as is


def test_with_json_the_job_and_the_trainer_write_to_stderr_and_stdout_is_the_outcome(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flow.cli import lifecycle

    seen: dict[str, object] = {}
    monkeypatch.setattr(lifecycle, "stack_up", lambda services: None)

    def launcher(stack: object, **kwargs: object) -> str:
        seen["launcher"] = kwargs
        return "spark"

    def retrain(stack: object, app: str, settings: workflow.RetrainSettings, *a: object) -> object:
        seen["settings"] = settings
        return RetrainOutcome("nothing-new", "test", 1, "")

    monkeypatch.setattr(lifecycle, "spark_launcher", launcher)
    monkeypatch.setattr(workflow, "retrain", retrain)
    monkeypatch.chdir(REPO)
    result = CliRunner().invoke(main, ["retrain", "pipelines/ctr_backfill.py", "--json"])
    assert result.exit_code == 4, result.output  # nothing new
    assert json.loads(result.stdout)["outcome"] == "nothing-new"
    assert seen["launcher"] == {"warm": True, "stdout_to_stderr": True}
    assert isinstance(seen["settings"], workflow.RetrainSettings)
    assert seen["settings"].output_to_stderr
