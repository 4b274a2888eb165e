"""``flow run --json`` and ``flow bench --json``: stdout holds one JSON document, everything a
person reads (the job's output, the benchmark's tables) goes to stderr, the exit code passes."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from flow.cli import jobs, main
from flow.config import BENCH_RESULT_ENV, RUN_RESULT_ENV, StackConfig
from flow.terminal import call, inherit, to_stderr
from flow.tracking import PARENT_RUN_ENV
from flow.workflows import together
from tests.support import REPO, run_flow, stack_env_for

BENCHMARK = f"""
import sys
sys.path.insert(0, {str(REPO / "benchmarks")!r})
from _results import save

NEEDS_SERVICES = False
NEEDS_SPARK = False

print("a table for people")
code = int(sys.argv[1]) if len(sys.argv) > 1 else 0
if code >= 0:
    print("results:", save("fake", {{"rows_per_s": 123.0, "argv": sys.argv[1:]}}))
raise SystemExit(max(code, 0))
"""


@pytest.fixture
def in_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A project folder with ``benchmarks/fake.py``, as the working folder; its environment."""
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "fake.py").write_text(BENCHMARK)
    monkeypatch.chdir(tmp_path)
    return stack_env_for(tmp_path / "home")


def test_bench_json_prints_the_result_saved_and_sends_the_benchmark_s_output_to_stderr(
    in_project: dict[str, str], capfd: pytest.CaptureFixture[str]
) -> None:
    done = CliRunner().invoke(main, ["bench", "--json", "fake", "0"], env=in_project)
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout) == {"rows_per_s": 123.0, "argv": ["0"]}
    said = capfd.readouterr()  # the benchmark's process writes to the real descriptors
    assert "a table for people" in said.err
    assert said.out == ""
    # The result is kept where the benchmark keeps it, as without --json.
    (kept,) = (Path(in_project["FLOW_HOME"]) / "bench").glob("fake-*.json")
    assert json.loads(kept.read_text())["rows_per_s"] == 123.0


def test_bench_json_passes_a_failure_s_exit_code_and_names_a_benchmark_that_saved_nothing(
    in_project: dict[str, str],
) -> None:
    failed = CliRunner().invoke(main, ["bench", "--json", "fake", "3"], env=in_project)
    assert failed.exit_code == 3
    assert failed.stdout == ""
    unsaved = CliRunner().invoke(main, ["bench", "--json", "fake", "-1"], env=in_project)
    assert unsaved.exit_code == 1
    assert unsaved.stdout == ""
    assert "benchmark 'fake' exited 0 but saved no result" in " ".join(unsaved.stderr.split())


def test_bench_s_json_is_flow_s_before_name_and_the_benchmark_s_after() -> None:
    before = jobs.bench.make_context("bench", ["--json", "fake", "--rows", "5"]).params
    assert (before["as_json"], before["argv"]) == (True, ("--rows", "5"))
    after = jobs.bench.make_context("bench", ["fake", "--json"]).params
    assert (after["as_json"], after["argv"]) == (False, ("--json",))


def test_a_process_started_to_stderr_keeps_stdout_free(capfd: pytest.CaptureFixture[str]) -> None:
    code = call(to_stderr, [sys.executable, "-c", "print('spark says'); exit(4)"], {})
    assert code == 4
    said = capfd.readouterr()
    assert (said.out, said.err) == ("", "spark says\n")


def test_the_warm_driver_s_stdout_goes_to_stderr_under_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    jobs._job_output_to_stderr("job line\n", 1)
    jobs._job_output("plain line\n", 1)
    said = capsys.readouterr()
    assert (said.out, said.err) == ("plain line\n", "job line\n")


# -- flow run --json ---------------------------------------------------------------------------

DRIVER_RESULT = {
    "pipeline": "ratings",
    "mlflow_run_id": "f" * 32,
    "mlflow_url": "http://127.0.0.1:15000/#/experiments/1/runs/" + "f" * 32,
    "stages": [
        {
            "stage": "backfill",
            "kind": "backfill",
            "channel": "ratings",
            "events_in": 300,
            "training_rows": 298,
            "dead_letters": 2,
            "pending": 0,
            "positives": 120,
            "seconds": 4.2,
            "reconciled": True,
        }
    ],
}

Job = Callable[[Sequence[str], dict[str, str]], int]


class Launched:
    """What ``flow run`` asked of Spark: the launcher's settings and each job's variables."""

    def __init__(self, code: int, writes: bool) -> None:
        self.code, self.writes = code, writes
        self.settings: dict[str, Any] = {}
        self.extras: list[dict[str, str]] = []

    def launcher(self, stack: StackConfig, connectors: str | None, **settings: Any) -> Job:
        self.settings = settings

        def spark(argv: Sequence[str], extra: dict[str, str]) -> int:
            self.extras.append(extra)
            if self.writes:  # as the driver does (spark_jobs.runner), where it is told
                Path(extra[RUN_RESULT_ENV]).write_text(json.dumps(DRIVER_RESULT))
            return self.code

        return spark


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An application file; no stack comes up (stack_up is the settings alone)."""
    for name, value in stack_env_for(tmp_path / "home").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(jobs, "stack_up", lambda: StackConfig.from_env())
    path = tmp_path / "job.py"
    path.write_text("print('the job')\n")
    return str(path)


def _launched(monkeypatch: pytest.MonkeyPatch, code: int = 0, writes: bool = True) -> Launched:
    launched = Launched(code, writes)
    monkeypatch.setattr(jobs, "spark_launcher", launched.launcher)
    return launched


def test_run_json_prints_the_pipeline_run_and_its_stages(
    app: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    launched = _launched(monkeypatch)
    done = CliRunner().invoke(main, ["run", "--master", "local[1]", "--json", app])
    assert done.exit_code == 0, done.output
    outcome = json.loads(done.stdout)
    assert outcome == {"app": app, "exit_code": 0, **DRIVER_RESULT}
    assert launched.settings["stdout_to_stderr"] is True
    (extra,) = launched.extras
    assert not Path(extra[RUN_RESULT_ENV]).exists()  # a temporary file, gone with the command


def test_run_json_of_a_failed_job_still_prints_its_exit_code(
    app: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _launched(monkeypatch, code=2, writes=False)
    done = CliRunner().invoke(main, ["run", "--json", app])
    assert done.exit_code == 2
    outcome = json.loads(done.stdout)
    assert outcome["exit_code"] == 2
    assert outcome["stages"] is None
    assert outcome["mlflow_run_id"] is None
    assert "exited with code 2" in done.stderr


def test_run_without_json_leaves_stdout_to_the_job(
    app: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    launched = _launched(monkeypatch, code=0, writes=False)
    done = CliRunner().invoke(main, ["run", app])
    assert done.exit_code == 0
    assert done.stdout == ""
    assert launched.settings["stdout_to_stderr"] is False
    assert launched.extras == [{}]


def test_run_json_with_a_trainer_adds_its_run_and_figures(
    app: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    launched = _launched(monkeypatch)
    trained = tmp_path / "trainer-result.json"
    trained.write_text(
        json.dumps(
            {
                "run_id": "t" * 32,
                "model_version": "3",
                "steps": 40,
                "rows": 298,
                "samples_per_s": 900.0,
                "metrics": {"run_progressive_auc": 0.71},
                "by_window": {"live": {}},  # the rest stays in the file
            }
        )
    )
    asked: dict[str, Any] = {}

    def run_together(
        argv: Sequence[str], trainer: Any, procs: int, stack: StackConfig, spark: Job, say: Any,
        start_trainer: Any = inherit,
    ) -> together.Together:  # fmt: skip
        asked["start_trainer"] = start_trainer
        code = spark(argv, {PARENT_RUN_ENV: "p" * 32})
        return together.Together("p" * 32, code, 0, trained)

    monkeypatch.setattr(together, "run_together", run_together)
    done = CliRunner().invoke(main, ["run", "--json", "--train", "--channel ratings", app])
    assert done.exit_code == 0, done.output
    outcome = json.loads(done.stdout)
    assert asked["start_trainer"] is to_stderr
    assert launched.extras[0][PARENT_RUN_ENV] == "p" * 32
    assert outcome["mlflow_run_id"] == "p" * 32  # the run both parts nest under
    assert outcome["stages"] == DRIVER_RESULT["stages"]
    assert outcome["spark_exit_code"] == 0
    assert outcome["trainer"] == {
        "exit_code": 0,
        "mlflow_run_id": "t" * 32,
        "model_version": "3",
        "steps": 40,
        "rows": 298,
        "samples_per_s": 900.0,
        "metrics": {"run_progressive_auc": 0.71},
        "result_file": str(trained),
    }


def test_a_pipeline_file_s_own_output_while_it_is_checked_goes_to_stderr(
    app: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _launched(monkeypatch)
    checked = Path(app).with_name("loud.py")
    checked.write_text(
        "print('building')\n"
        "from flow.pipeline import run_main\n"
        "from pipelines.ratings import ratings\n\n\n"
        "def loud():\n    return ratings()\n\n\n"
        "if __name__ == '__main__':\n    run_main(loud())\n"
    )
    done = CliRunner().invoke(main, ["run", "--json", str(checked)])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["app"] == str(checked)
    assert "building" in done.stderr


def test_the_environment_names_are_declared_settings() -> None:
    # An unknown FLOW_* variable is an error in every process: these must be known ones.
    assert (RUN_RESULT_ENV, BENCH_RESULT_ENV) == ("FLOW_RUN_RESULT", "FLOW_BENCH_RESULT")
    StackConfig.from_env({RUN_RESULT_ENV: "/tmp/r.json", BENCH_RESULT_ENV: "/tmp/b.json"})


@pytest.mark.integration  # a real benchmark in its own process, as a user runs it: seconds
def test_flow_bench_json_prints_a_real_benchmark_s_result(tmp_path: Path) -> None:
    small = ["--seconds", "5", "--rate", "200", "--per-day", "2000", "--users", "100"]
    done = run_flow(["bench", "--json", "generate", *small], stack_env_for(tmp_path))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["history"]["impressions"] > 0
    assert result["realtime"]
    assert "results: " in done.stderr  # the benchmark's own lines
