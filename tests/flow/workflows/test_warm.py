"""The warm driver's client side: when a job may go to it, the wire, and a job's life as the
caller sees it (against a server thread speaking the protocol; the real driver is in
tests/spark_jobs/test_warm.py)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from flow.config import StackConfig
from flow.workflows.warm import (
    EXIT_LOST,
    DriverState,
    JobRequest,
    app_argv,
    code_fingerprint,
    find_driver,
    job_env,
    read_message,
    run_on_driver,
    send_message,
    stack_fingerprint,
    state_path,
    stop_driver,
    token_matches,
    write_state,
)
from tests.support import stack_env_for

Script = Callable[[socket.socket, dict[str, Any]], None]


def _stack(home: Path, **env: str) -> StackConfig:
    return StackConfig.from_env({**stack_env_for(home), **env})


def _state(stack: StackConfig, port: int = 1, **changes: Any) -> DriverState:
    state = DriverState(
        pid=os.getpid(),
        group=os.getpgid(0),
        port=port,
        token="t" * 64,
        master=stack.spark.master,
        connectors=None,
        stack=stack_fingerprint(stack, stack.spark.master),
        code=code_fingerprint(),
        started=time.time(),
        log="driver.log",
    )
    return replace(state, **changes)


def test_a_driver_takes_only_jobs_that_would_run_the_same_on_a_driver_of_their_own(
    tmp_path: Path,
) -> None:
    stack = _stack(tmp_path)
    state = _state(stack)
    assert state.refusal(stack, stack.spark.master, frozenset({"kafka"})) is None
    assert state.refusal(stack, stack.spark.master, None) is None
    assert "spark://elsewhere:7077" in str(state.refusal(stack, "spark://elsewhere:7077", None))
    other = _stack(tmp_path, FLOW_KAFKA_PORT="29999")
    assert "FLOW_" in str(state.refusal(other, other.spark.master, None))
    secret = _stack(tmp_path, FLOW_CATALOG_PROPERTIES="s3.secret-access-key=x")
    assert stack_fingerprint(secret, "local[*]") != stack_fingerprint(stack, "local[*]")
    lean = replace(state, connectors=["kafka"])
    assert lean.refusal(stack, stack.spark.master, frozenset({"kafka"})) is None
    assert "delta" in str(lean.refusal(stack, stack.spark.master, frozenset({"delta"})))
    assert "every connector" in str(lean.refusal(stack, stack.spark.master, None))
    stale = replace(state, code="0" * 16)
    assert "code changed" in str(stale.refusal(stack, stack.spark.master, None))


def test_only_an_application_and_its_arguments_go_to_the_driver() -> None:
    assert app_argv(["app.py", "--namespace", "x"]) == ["app.py", "--namespace", "x"]
    assert app_argv(["--conf", "spark.x=1", "app.py"]) is None
    assert app_argv(["--driver-memory", "4g", "app.py"]) is None
    assert app_argv([]) is None


def test_a_job_takes_its_callers_flow_and_mlflow_variables_only() -> None:
    environ = {"FLOW_HOME": "/h", "MLFLOW_X": "1", "PATH": "/bin", "JAVA_HOME": "/j"}
    assert job_env({"FLOW_PARENT_RUN_ID": "r"}, environ) == {
        "FLOW_HOME": "/h",
        "MLFLOW_X": "1",
        "FLOW_PARENT_RUN_ID": "r",
    }


def test_messages_round_trip_and_a_foreign_stream_is_refused() -> None:
    left, right = socket.socketpair()
    with left, right:
        send_message(left, {"out": "é\n", "fd": 2})
        assert read_message(right) == {"out": "é\n", "fd": 2}
        left.sendall(b"\xff\xff\xff\xff")
        with pytest.raises(EOFError, match="not this protocol"):
            read_message(right)
    left, right = socket.socketpair()
    with right:
        left.close()
        with pytest.raises(EOFError):
            read_message(right)
    assert token_matches("abc", "abc")
    assert not token_matches("abd", "abc")
    assert not token_matches(None, "abc")


def test_a_state_file_is_private_and_a_dead_driver_s_is_removed(tmp_path: Path) -> None:
    stack = _stack(tmp_path)
    path = write_state(stack.home, _state(stack))
    assert path == state_path(stack.home)
    assert path.stat().st_mode & 0o777 == 0o600
    found = find_driver(stack.home)
    assert found is not None
    assert found.pid == os.getpid()
    write_state(stack.home, _state(stack, pid=2**22 + 12345))  # no such process
    assert find_driver(stack.home) is None
    assert not path.exists()
    assert stop_driver(stack.home) is None


@pytest.fixture
def server() -> Iterator[Callable[[Script], int]]:
    """A one-connection server running ``script(sock, first_message)``; its port."""
    listeners: list[socket.socket] = []

    def serve(script: Script) -> int:
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)

        def accept() -> None:
            sock, _ = listener.accept()
            with sock:
                script(sock, read_message(sock))

        threading.Thread(target=accept, daemon=True).start()
        port: int = listener.getsockname()[1]
        return port

    yield serve
    for listener in listeners:
        listener.close()


def _collect() -> tuple[list[tuple[str, int]], Callable[[str, int], None]]:
    said: list[tuple[str, int]] = []
    return said, lambda text, fd: said.append((text, fd))


def test_a_job_s_output_streams_back_and_its_exit_code_is_returned(
    tmp_path: Path, server: Callable[[Script], int]
) -> None:
    got: dict[str, Any] = {}

    def driver(sock: socket.socket, first: dict[str, Any]) -> None:
        got.update(first)
        send_message(sock, {"started": 1})
        send_message(sock, {"out": "rows: 10\n", "fd": 1})
        send_message(sock, {"out": "warning\n", "fd": 2})
        send_message(sock, {"exit": 3})

    stack = _stack(tmp_path)
    state = _state(stack, port=server(driver))
    request = JobRequest(argv=["app.py", "--x"], cwd="/w", env={"FLOW_HOME": "/h"})
    said, out = _collect()
    assert run_on_driver(state, request, out) == 3
    assert said == [("rows: 10\n", 1), ("warning\n", 2)]
    assert got["token"] == state.token
    assert got["job"] == {"argv": ["app.py", "--x"], "cwd": "/w", "env": {"FLOW_HOME": "/h"}}


def test_a_busy_or_silent_driver_leaves_the_job_to_a_driver_of_its_own(
    tmp_path: Path, server: Callable[[Script], int]
) -> None:
    stack = _stack(tmp_path)
    request = JobRequest(argv=["app.py"], cwd="/w", env={})
    busy = _state(stack, port=server(lambda sock, _: send_message(sock, {"busy": "other.py"})))
    said, out = _collect()
    assert run_on_driver(busy, request, out) == "it is running another job (other.py)"
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    result = run_on_driver(_state(stack, port=port), request, out)
    assert isinstance(result, str)
    assert result.startswith("it did not answer")
    assert said == []


def test_a_driver_that_ends_during_the_job_fails_it_and_says_where_its_log_is(
    tmp_path: Path, server: Callable[[Script], int]
) -> None:
    def dies(sock: socket.socket, _: dict[str, Any]) -> None:
        send_message(sock, {"started": 1})
        send_message(sock, {"out": "half\n", "fd": 1})

    state = _state(_stack(tmp_path), port=server(dies))
    said, out = _collect()
    assert run_on_driver(state, JobRequest(["app.py"], "/w", {}), out) == EXIT_LOST
    assert said[0] == ("half\n", 1)
    assert "driver.log" in said[1][0]
    assert said[1][1] == 2
