from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.stack import jars
from spark_jobs import submit


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StackConfig:
    lib = tmp_path / "lib"
    resolved = jars.ResolvedJars(
        "spark", lib, (lib / "iceberg.jar", lib / "sqlite-jdbc-1.jar"), (lib / "sqlite-jdbc-1.jar",)
    )
    monkeypatch.setattr(submit, "stack_jars", lambda _stack: resolved)
    return StackConfig.from_env({"FLOW_HOME": str(tmp_path)})


@pytest.fixture
def app(tmp_path: Path) -> str:
    path = tmp_path / "job.py"
    path.write_text("print('hi')\n")
    return str(path)


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_options_before_the_app_go_to_spark_submit_and_the_rest_to_the_app() -> None:
    args = submit.split_submit_argv(
        ["--master", "local[2]", "--verbose", "--conf=spark.x=1", "job.py", "--events", "5"]
    )
    assert args.options == [("--master", "local[2]"), ("--verbose", None), ("--conf", "spark.x=1")]
    assert args.app == "job.py"
    assert args.app_args == ["--events", "5"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--master"], "needs a value"), (["--master", "local"], "no application given")],
)
def test_malformed_command_lines_say_what_is_missing(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        submit.split_submit_argv(argv)


def test_the_stack_settings_are_added_under_the_users(stack: StackConfig, app: str) -> None:
    launch = submit.submit_command(
        [
            "--master",
            "local[1]",
            "--conf",
            "spark.sql.session.timeZone=Europe/Paris",
            "--jars",
            "/opt/extra.jar",
            app,
            "--events",
            "7",
        ],
        stack,
    )
    argv = launch.argv
    assert argv[-3:] == [app, "--events", "7"]
    assert _pairs(argv, "--master") == ["local[1]"]
    confs = _pairs(argv, "--conf")
    assert "spark.sql.session.timeZone=Europe/Paris" in confs
    assert not any(c.startswith("spark.sql.session.timeZone=UTC") for c in confs)
    assert any(c.startswith("spark.sql.catalog.flow.uri=jdbc:sqlite:") for c in confs)
    # spark-submit keeps only the last --jars: the user's jars are merged into the stack's.
    assert _pairs(argv, "--jars") == [
        f"{stack.home}/lib/iceberg.jar,{stack.home}/lib/sqlite-jdbc-1.jar,/opt/extra.jar"
    ]
    assert _pairs(argv, "--driver-class-path") == [f"{stack.home}/lib/sqlite-jdbc-1.jar"]
    assert launch.env["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert launch.env["PYSPARK_PYTHON"]


def test_the_default_master_comes_from_the_stack(stack: StackConfig, app: str) -> None:
    launch = submit.submit_command([app], stack)
    assert _pairs(launch.argv, "--master") == ["local[*]"]
    assert _pairs(launch.argv, "--driver-memory") == ["2g"]


def test_a_cluster_master_gets_no_local_tuning(stack: StackConfig, app: str) -> None:
    launch = submit.submit_command(["--master", "spark://m:7077", app], stack)
    confs = _pairs(launch.argv, "--conf")
    assert not any(c.startswith("spark.driver.bindAddress") for c in confs)
    assert "--driver-memory" not in launch.argv
    assert "SPARK_LOCAL_IP" not in launch.env


def test_spark_submit_runs_the_application_with_this_interpreter(
    stack: StackConfig, app: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.delenv("SPARK_HOME", raising=False)
    env = submit.submit_command([app], stack).env
    assert env["PYSPARK_PYTHON"] == sys.executable
    assert Path(env["SPARK_HOME"], "bin", "spark-class").exists()


def test_a_missing_application_is_named(stack: StackConfig, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.py does not exist"):
        submit.submit_command([str(tmp_path / "nope.py")], stack)
