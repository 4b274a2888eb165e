"""The warm driver (spark_jobs/warm.py): a job runs as spark-submit would run its file and
leaves nothing behind; and, on the real stack, ``flow run`` hands jobs to a running driver."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest

from flow.config import StackConfig
from flow.workflows.ingest import LoadOptions, load_file
from flow.workflows.timestamps import TimeRules
from flow.workflows.warm import JobRequest, find_driver, read_message, send_message
from spark_jobs.warm import _Server, run_application
from tests.support import FLOW_BIN, REPO, clean_environ, handoff_rows, run_flow


def _run(app: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    request = JobRequest(argv=[app.name, *args], cwd=str(app.parent), env=env or {})
    code = run_application(request, out, err, nullcontext)
    return code, out.getvalue(), err.getvalue()


def test_a_job_runs_as_main_in_its_folder_with_its_arguments_and_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOW_DEBUG", "1")  # the driver's own: the job does not see it
    app = tmp_path / "app.py"
    app.write_text(
        textwrap.dedent(
            """
            import os, sys
            import helper
            print(__name__, sys.argv[1:], os.getcwd(), helper.VALUE)
            print(os.environ.get("FLOW_PARENT_RUN_ID"), os.environ.get("FLOW_DEBUG"))
            os.environ["FLOW_LEFT_BEHIND"] = "1"
            sys.path.append("/nowhere")
            print("to stderr", file=sys.stderr)
            """
        )
    )
    (tmp_path / "helper.py").write_text("VALUE = 1\n")
    before = (dict(os.environ), os.getcwd(), list(sys.argv), list(sys.path), sys.stdout)
    code, out, err = _run(app, "--namespace", "x", env={"FLOW_PARENT_RUN_ID": "run-1"})
    assert code == 0, err
    assert out.splitlines() == [f"__main__ ['--namespace', 'x'] {tmp_path} 1", "run-1 None"]
    assert err == "to stderr\n"
    assert (dict(os.environ), os.getcwd(), list(sys.argv), list(sys.path), sys.stdout) == before
    assert "helper" not in sys.modules
    # An edited module of the job's is read again by the next job.
    (tmp_path / "helper.py").write_text("VALUE = 2\n")
    assert _run(app)[1].splitlines()[0].endswith(" 2")


@pytest.mark.parametrize(
    ("body", "code", "said"),
    [
        ("raise SystemExit(3)", 3, ""),
        ("import sys; sys.exit('no rows')", 1, "no rows\n"),
        ("raise ValueError('boom')", 1, "ValueError: boom"),
        ("raise KeyboardInterrupt", 130, "cancelled"),
        ("print('fine')", 0, ""),
    ],
)
def test_a_job_s_exit_code_and_error_are_those_python_would_give(
    tmp_path: Path, body: str, code: int, said: str
) -> None:
    app = tmp_path / "app.py"
    app.write_text(body + "\n")
    got, _, err = _run(app)
    assert got == code
    assert said in err


def _greet(server: _Server, message: dict[str, object]) -> dict[str, object] | None:
    left, right = socket.socketpair()
    with left:
        send_message(left, message)
        server._greet(right)
        try:
            return read_message(left)
        except EOFError:
            return None


def test_the_server_drops_strangers_and_says_when_it_is_busy() -> None:
    server = _Server(spark=None, idle_s=60, say=lambda _: None)
    try:
        job: dict[str, Any] = {"argv": ["app.py"], "cwd": "/w", "env": {}}
        assert _greet(server, {"token": "wrong", "job": job}) is None
        assert server.jobs.empty()
        server.busy.set()
        server.running = "other.py"
        assert _greet(server, {"token": server.token, "job": job}) == {"busy": "other.py"}
        assert server.jobs.empty()
        server.busy.clear()
        left, right = socket.socketpair()
        with left, right:
            send_message(left, {"token": server.token, "job": job})
            server._greet(right)
            _sock, request = server.jobs.get_nowait()
            assert request == JobRequest(**job)
            assert server.busy.is_set()
    finally:
        server.listener.close()


RATINGS_APP = """
from flow.pipeline import run_main
from pipelines.ratings import ratings


def app():
    return ratings("warm.ratings")


if __name__ == "__main__":
    run_main(app())
"""

SESSION_APP = """
from pyspark.sql import SparkSession
from spark_jobs.session import get_session

spark = get_session()
assert spark is SparkSession.builder.getOrCreate()
print("partitions", spark.conf.get("spark.sql.shuffle.partitions"))
print("views", [t.name for t in spark.catalog.listTables() if t.isTemporary])
spark.conf.set("spark.sql.shuffle.partitions", "7")
spark.range(3).createOrReplaceTempView("left_behind")
spark.stop()  # as scripts end: the driver's context outlives it
"""


@pytest.fixture
def warm_driver(running_stack: StackConfig, stack_env: dict[str, str]) -> Iterator[str]:
    started = run_flow(["driver", "start", "--idle-minutes", "15"], stack_env)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        yield started.stdout + started.stderr
    finally:
        run_flow(["driver", "stop"], stack_env)
    assert find_driver(running_stack.home) is None


@pytest.mark.integration
def test_flow_run_hands_jobs_to_the_warm_driver(
    running_stack: StackConfig, stack_env: dict[str, str], warm_driver: str, tmp_path: Path
) -> None:
    csv = tmp_path / "ratings.csv"
    lines = ["user_id,movie_id,rating,ts"]
    lines += [f"{i % 13},{i % 7},{(2 + i % 9) / 2},{1_600_000_000 + 60 * i}" for i in range(300)]
    csv.write_text("\n".join(lines) + "\n")
    options = LoadOptions(
        table="warm.ratings",
        timestamp_columns=("ts",),
        time=TimeRules(epoch_unit="s"),
        label="rating>=4",
        mode="replace",
    )
    with load_file(running_stack, csv, options) as load:
        load.write()
    app = tmp_path / "warm_app.py"
    app.write_text(RATINGS_APP)

    # --json: the job's output, relayed from the driver, goes to stderr; stdout is one object.
    done = run_flow(["run", "--json", str(app)], stack_env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "on the warm driver" in done.stderr
    assert "300 training rows" in done.stderr
    outcome = json.loads(done.stdout)
    assert (outcome["exit_code"], outcome["pipeline"]) == (0, "ratings")
    assert re.fullmatch(r"[0-9a-f]{32}", outcome["mlflow_run_id"])
    (stage,) = outcome["stages"]
    assert (stage["stage"], stage["events_in"], stage["training_rows"]) == ("backfill", 300, 300)
    assert stage["reconciled"] is True
    rows = handoff_rows(f"{running_stack.handoff}/warm", "ratings")
    assert rows.num_rows == 300
    assert set(rows.column("label").to_pylist()) == {0, 1}

    # Each job has a session of its own: what one sets, the next does not see.
    session_app = tmp_path / "session_app.py"
    session_app.write_text(SESSION_APP)
    outputs = []
    for _ in range(2):
        done = run_flow(["run", str(session_app)], stack_env)
        assert done.returncode == 0, done.stdout + done.stderr
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]
    assert "views []" in outputs[1]
    assert "partitions 7" not in outputs[1]

    # A failing job fails the command, not the driver.
    broken = tmp_path / "broken_app.py"
    broken.write_text("raise ValueError('the job is broken')\n")
    failed = run_flow(["run", str(broken)], stack_env)
    assert failed.returncode == 1
    assert "ValueError: the job is broken" in failed.stdout + failed.stderr
    assert run_flow(["driver", "status"], stack_env).returncode == 0

    # Ctrl-C cancels the job on the driver, which then takes the next one.
    sleeper = tmp_path / "sleeper.py"
    started = tmp_path / "started"
    sleeper.write_text(
        f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(300)\n"
    )
    waiting = subprocess.Popen(
        [FLOW_BIN, "run", str(sleeper)],
        env={**clean_environ(), **stack_env},
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    waiting.send_signal(signal.SIGINT)
    said, _ = waiting.communicate(timeout=120)
    assert waiting.returncode == 130, said
    assert "cancelled" in said
    again = run_flow(["run", str(session_app)], stack_env)
    assert again.returncode == 0
    assert "on the warm driver" in again.stdout + again.stderr
