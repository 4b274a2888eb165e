from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from flow.cli import main
from tests.support import run_flow, stack_env_for


def test_help_lists_the_commands() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for command in ("services", "ui", "jars", "submit", "run", "spark-args"):
        assert command in result.output


def test_status_of_a_fresh_stack_is_stopped(tmp_path: Path) -> None:
    done = run_flow(["services", "status", "--json"], stack_env_for(tmp_path))
    assert done.returncode == 0, done.stderr
    states = {row["name"]: row["state"] for row in json.loads(done.stdout)}
    assert states == {"kafka": "stopped", "iceberg": "stopped", "mlflow": "stopped"}


def test_a_bad_setting_is_one_clear_line_without_a_traceback(tmp_path: Path) -> None:
    done = run_flow(["services", "status"], {"FLOW_HOME": str(tmp_path), "FLOW_KAFKA_PORT": "80"})
    assert done.returncode == 1
    assert "FLOW_KAFKA_PORT=80 is outside 1024-65535" in done.stderr
    assert "Traceback" not in done.stderr


def test_submit_without_an_application_explains_usage(tmp_path: Path) -> None:
    done = run_flow(["submit", "--master", "local[1]"], stack_env_for(tmp_path))
    assert done.returncode == 1
    assert "no application given" in done.stderr


def test_brackets_in_messages_are_printed_not_taken_for_markup(tmp_path: Path) -> None:
    missing = tmp_path / "job[1].py"
    done = run_flow(["submit", str(missing)], stack_env_for(tmp_path))
    assert done.returncode == 1
    assert f"{missing} does not exist" in done.stderr.replace("\n", "")


def test_a_benchmark_can_say_it_runs_without_the_services_or_spark(tmp_path: Path) -> None:
    from flow.cli.jobs import flag

    quiet = tmp_path / "quiet.py"
    quiet.write_text('"""A benchmark."""\nNEEDS_SERVICES = False\nNEEDS_SPARK = False\n')
    plain = tmp_path / "plain.py"
    plain.write_text("print('hello')\n")
    assert not flag(quiet, "NEEDS_SERVICES")
    assert not flag(quiet, "NEEDS_SPARK")
    assert flag(plain, "NEEDS_SERVICES")
    assert flag(plain, "NEEDS_SPARK")
    assert not flag(Path("benchmarks/handoff.py"), "NEEDS_SERVICES")
    assert not flag(Path("benchmarks/trainer.py"), "NEEDS_SPARK")


def test_flow_train_is_the_trainer_and_bench_help_lists_the_benchmarks(tmp_path: Path) -> None:
    env = stack_env_for(tmp_path)
    trained = run_flow(["train", "--help"], env)
    assert trained.returncode == 0, trained.stderr
    assert trained.stdout.startswith("usage: python -m trainers train")
    listed = CliRunner().invoke(main, ["bench", "--help"])
    assert listed.exit_code == 0
    assert "Benchmarks: batch_anatomy, commits, " in " ".join(listed.output.split())


def test_a_benchmarks_help_starts_no_service(tmp_path: Path) -> None:
    # freshness needs Kafka, MLflow and Spark to run; its --help needs none of them.
    done = run_flow(["bench", "freshness", "--help"], stack_env_for(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
    states = run_flow(["services", "status", "--json"], stack_env_for(tmp_path))
    assert {row["state"] for row in json.loads(states.stdout)} == {"stopped"}
