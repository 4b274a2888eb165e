"""``flow services``: the real broker and MLflow server, started, killed and stopped."""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import socket
import uuid
from pathlib import Path
from unittest import mock

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flow import stack as services
from flow.config import StackConfig
from flow.errors import JavaNotFoundError, PortInUseError, ServiceStartError
from flow.stack import broker
from flow.stack.process import ProcessRecord, alive
from tests.support import run_flow, stack_env_for


def _processes_under(home: Path) -> list[str]:
    """Command lines of live processes that mention the stack's folder."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(home) in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(cmdline[:200])
    return found


def _pids(env: dict[str, str]) -> dict[str, int | None]:
    done = run_flow(["services", "status", "--json"], env)
    return {row["name"]: row["pid"] for row in json.loads(done.stdout)}


@pytest.mark.integration
def test_up_twice_is_harmless_and_down_leaves_no_process(tmp_path: Path) -> None:
    env = stack_env_for(tmp_path / "home")
    home = Path(env["FLOW_HOME"]).resolve()
    try:
        first = run_flow(["services", "up"], env)
        assert first.returncode == 0, first.stderr
        pids = _pids(env)
        assert pids["kafka"]
        assert pids["mlflow"]

        second = run_flow(["services", "up"], env)
        assert second.returncode == 0, second.stderr
        assert _pids(env) == pids, "a second `up` must not start anything new"
        assert "starting" not in second.stderr
    finally:
        down = run_flow(["services", "down"], env)
    assert down.returncode == 0, down.stderr
    assert _processes_under(home) == []
    status = json.loads(run_flow(["services", "status", "--json"], env).stdout)
    assert {row["name"]: row["state"] for row in status} == {
        "kafka": "stopped",
        "iceberg": "ready",
        "mlflow": "stopped",
    }


@pytest.mark.integration
def test_status_tells_the_truth_after_the_broker_is_killed(tmp_path: Path) -> None:
    env = stack_env_for(tmp_path / "home")
    stack = StackConfig.from_env(env)
    try:
        (row,) = services.up(stack, ("kafka",))
        assert row.state == "running"
        assert row.pid is not None
        os.kill(row.pid, signal.SIGKILL)
        psutil.Process(row.pid).wait(timeout=10)

        (row,) = services.status(stack, ("kafka",))
        assert row.state == "dead"
        assert "gone without `flow services down`" in row.detail
        cli = run_flow(["services", "status", "--only", "kafka"], env)
        assert cli.returncode == 1
        assert "dead" in cli.stderr

        (again,) = services.up(stack, ("kafka",))
        assert again.state == "running"
        assert again.pid != row.pid
    finally:
        services.down(stack)


@pytest.mark.integration
def test_a_broker_that_dies_at_start_reports_the_end_of_its_log(tmp_path: Path) -> None:
    env = stack_env_for(tmp_path / "home") | {"FLOW_KAFKA_HEAP": "1k"}
    stack = StackConfig.from_env(env)
    try:
        with pytest.raises(ServiceStartError) as caught:
            services.up(stack, ("kafka",))
    finally:
        services.down(stack)
    message = str(caught.value)
    assert "exited while starting" in message
    assert "heap" in message.lower()  # the JVM's own words, from the log's last lines
    record = ProcessRecord.load(stack.services_dir / "kafka" / "process.json")
    assert record is None or not alive(record)


@pytest.mark.integration
def test_a_cluster_id_that_starts_with_a_dash_still_formats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One first start in 64 draws such an id; the storage tool once read it as an option.
    monkeypatch.setattr(broker, "new_cluster_id", lambda: "-Ab3kPp0TNmZ1x2YhQ7uWg")
    stack = StackConfig.from_env(stack_env_for(tmp_path / "home"))
    try:
        (status,) = services.up(stack, ("kafka",))
        assert status.state == "running"
    finally:
        services.down(stack)
    meta = (stack.services_dir / "kafka" / "data" / "meta.properties").read_text()
    assert "cluster.id=-Ab3kPp0TNmZ1x2YhQ7uWg" in meta.splitlines()


@settings(max_examples=300)
@given(st.randoms(use_true_random=False))
def test_new_cluster_ids_are_kafka_uuids_that_no_parser_takes_for_an_option(
    rng: random.Random,
) -> None:
    draw = lambda: uuid.UUID(int=rng.getrandbits(128))  # noqa: E731
    with mock.patch.object(uuid, "uuid4", side_effect=draw):
        cluster_id = broker.new_cluster_id()
    assert not cluster_id.startswith("-")
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


def test_a_taken_port_names_the_setting_to_change(tmp_path: Path) -> None:
    env = stack_env_for(tmp_path / "home")
    stack = StackConfig.from_env(env)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", stack.kafka.port))
        squatter.listen()
        with pytest.raises(PortInUseError, match=f"{stack.kafka.port}.*set FLOW_KAFKA_PORT"):
            services.up(stack, ("kafka",))


def test_a_missing_java_is_reported_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = StackConfig.from_env(stack_env_for(tmp_path / "home"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(JavaNotFoundError, match="install a Java 17"):
        services.up(stack, ("kafka",))
    assert _processes_under(stack.home) == []


@pytest.mark.integration
def test_flow_ui_prints_the_address_of_the_running_server(
    running_stack: StackConfig, stack_env: dict[str, str]
) -> None:
    done = run_flow(["ui"], stack_env)
    assert done.returncode == 0, done.stderr
    # The experiments list in MLflow 3's "Model training" mode, not its GenAI pages.
    address = f"{running_stack.mlflow.tracking_uri}/#/experiments?workflowType=machine_learning"
    assert f"MLflow UI: {address}" in done.stdout
