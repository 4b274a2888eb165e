"""Pipeline files as the Spark driver runs them (``python FILE args``, which is what spark-submit
starts): a mistake in the definition is one line and exit code 1, never a traceback, unless
asked for with --debug or FLOW_DEBUG=1. (Through spark-submit: tests/spark_jobs.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import REPO, clean_environ, run_flow, stack_env_for

UNKNOWN_KEY = """
from dataclasses import replace
from flow.pipeline import BackfillStage, run_main
from pipelines.ctr_backfill import ctr_backfill

def pipeline():
    stage = ctr_backfill().stages[0]
    bad = BackfillStage(stage.name, events=stage.events, features=stage.features, chanel="x")
    return replace(ctr_backfill(), stages=(bad,))

if __name__ == "__main__":
    run_main(pipeline())
"""

MISSING_COLUMN = """
from dataclasses import replace
from flow.pipeline import Hashed, run_main
from pipelines.ctr_backfill import ctr_backfill

def pipeline():
    base = ctr_backfill()
    stage = base.stages[0]
    spec = replace(stage.features, features=(*stage.features.features, Hashed("user_agee", 10)))
    return replace(base, stages=(replace(stage, features=spec),))

if __name__ == "__main__":
    run_main(pipeline())
"""


def run_file(
    tmp_path: Path, text: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    app = tmp_path / "pipeline.py"
    app.write_text(text)
    path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    return subprocess.run(
        [sys.executable, str(app), *args],
        env={
            **clean_environ(),
            **stack_env_for(tmp_path / "home"),
            "PYTHONPATH": path,
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            UNKNOWN_KEY,
            "error: BackfillStage(chanel='x'): BackfillStage has no field 'chanel'; its fields: "
            "name, events, features, channel, label, enrich, derive, history, fit, "
            "max_dead_share; did you mean 'channel'?",
        ),
        (
            MISSING_COLUMN,
            "error: stage 'backfill': feature 'user_agee' reads column 'user_agee', which does "
            "not exist here; available: ",
        ),
    ],
    ids=["unknown-key", "missing-column"],
)
def test_a_mistake_in_a_pipeline_file_is_one_line_and_exit_1(
    tmp_path: Path, text: str, said: str
) -> None:
    done = run_file(tmp_path, text)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(said)
    if text is MISSING_COLUMN:
        assert lines[0].endswith("did you mean 'user_age'?")


@pytest.mark.parametrize(
    ("args", "env"), [(("--debug",), {}), ((), {"FLOW_DEBUG": "1"})], ids=["flag", "env"]
)
def test_debug_shows_the_traceback(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str]
) -> None:
    done = run_file(tmp_path, UNKNOWN_KEY, *args, env=env)
    assert done.returncode == 1
    assert done.stderr.startswith("Traceback (most recent call last):")
    assert "has no field 'chanel'" in done.stderr.splitlines()[-1]


def test_a_bad_run_flag_is_a_usage_error_and_a_bad_setting_one_line(tmp_path: Path) -> None:
    good = "from flow.pipeline import run_main\nfrom pipelines.ctr_backfill import ctr_backfill\n"
    good += "run_main(ctr_backfill())\n"
    done = run_file(tmp_path, good, "--stage", "backfil")
    assert done.returncode == 2
    assert "did you mean 'backfill'?" in done.stderr
    assert "Traceback" not in done.stderr
    done = run_file(tmp_path, good, env={"FLOW_HANDOF": "/tmp"})
    assert done.returncode == 1
    assert done.stderr.startswith("error: unknown setting(s) FLOW_HANDOF;")
    assert len(done.stderr.splitlines()) == 1


def test_connectors_are_all_none_or_a_list_of_known_ones() -> None:
    from flow.engine import parse_connectors
    from flow.errors import ConfigError

    assert parse_connectors("all") is None
    assert parse_connectors("none") == frozenset()
    assert parse_connectors("kafka, delta") == frozenset({"kafka", "delta"})
    with pytest.raises(ConfigError, match=r"no connector iceberg.*kafka"):
        parse_connectors("iceberg,kafka")


@pytest.mark.parametrize(
    "text", [UNKNOWN_KEY, MISSING_COLUMN], ids=["unknown-key", "missing-column"]
)
def test_flow_run_shows_a_pipeline_mistake_before_it_starts_anything(
    tmp_path: Path, text: str
) -> None:
    # The services are down and stay down: the pipeline is built before the stack starts.
    app = tmp_path / "pipeline.py"
    app.write_text(text)
    env = {**stack_env_for(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    done = run_flow(["run", str(app)], env, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr
    status = run_flow(["services", "status", "--json"], env)
    assert {row["state"] for row in json.loads(status.stdout)} == {"stopped"}


def test_a_correct_pipeline_file_passes_its_check_and_a_bad_flag_fails_it(tmp_path: Path) -> None:
    good = "from flow.pipeline import run_main\nfrom pipelines.ctr_backfill import ctr_backfill\n"
    good += "run_main(ctr_backfill())\n"
    assert run_file(tmp_path, good, "--check").returncode == 0
    assert run_file(tmp_path, UNKNOWN_KEY, "--check").returncode == 1
    assert run_file(tmp_path, good, "--check", "--stage", "nope").returncode == 2


def test_a_caller_that_prints_its_own_table_turns_the_drivers_off() -> None:
    from flow.pipeline.run import parse_run_args

    assert parse_run_args([], ["backfill"]).summary
    quiet = parse_run_args(["--continuous", "--no-summary"], ["backfill", "live"])
    assert not quiet.summary
    assert quiet.mode == "continuous"


def _blocker(tmp_path: Path) -> str:
    """A regular file where a folder should be: unwritable even for root (chmod is not)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    return str(blocker)


@pytest.mark.parametrize(
    ("checkpoints", "says"),
    [
        (
            lambda _: "s3://flow/ck?endpoint_override=127.0.0.1:9&region=x",
            "Spark cannot read S3 options or credentials written in a URI",
        ),
        (lambda _: "s3x://flow/ck", "is not a location this process can open"),
        (_blocker, "cannot write to"),
    ],
    ids=["query-string", "unknown-scheme", "unwritable"],
)
def test_flow_run_probes_the_streaming_checkpoint_before_it_starts_anything(
    tmp_path: Path, checkpoints: Callable[[Path], str], says: str
) -> None:
    """A checkpoint location Spark could not use was refused by the query, 72 s in, after the
    executors had started: now by ``flow run`` at once, naming the setting, services down."""
    env = {
        **stack_env_for(tmp_path / "home"),
        "PYTHONPATH": str(REPO),
        "FLOW_CHECKPOINTS": checkpoints(tmp_path),
    }
    done = run_flow(["run", "pipelines/ctr_streaming.py"], env, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: FLOW_CHECKPOINTS: "), done.stderr
    assert says in last
    assert "Traceback" not in done.stderr
    status = run_flow(["services", "status", "--json"], env)
    assert {row["state"] for row in json.loads(status.stdout)} == {"stopped"}
