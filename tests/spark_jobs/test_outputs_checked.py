"""A stage's outputs are checked writable before any Spark work: an unwritable location fails
the pipeline file in a second, with one line naming the setting (no Spark session started)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from flow.config import StackConfig
from flow.pipeline import BackfillStage, HandoffOutput, LiveStage
from flow.pipeline.outputs import Output, stage_outputs
from pipelines.ctr_backfill import ctr_backfill
from pipelines.ctr_streaming import ctr_streaming
from tests.support import REPO, clean_environ, stack_env_for


def settings(outputs: list[Output]) -> list[str]:
    return [output.setting for output in outputs]


def test_each_stage_checks_what_it_writes(tmp_path: Path) -> None:
    stack = StackConfig.from_env(stack_env_for(tmp_path))
    backfill = ctr_backfill()
    stage = backfill.stage("backfill", BackfillStage)
    fitting = stage_outputs(stack, backfill, stage, fits=True)
    assert settings(fitting) == ["FLOW_HANDOFF", "FLOW_FEATURE_STATE", "FLOW_WAREHOUSE"]
    assert fitting[0].where.uri == f"{stack.handoff}/ctr/backfill"
    assert fitting[1].where.uri == f"{stack.feature_state}/ctr/{stage.features.name}"
    assert "FLOW_FEATURE_STATE" not in settings(stage_outputs(stack, backfill, stage, fits=False))
    streaming = ctr_streaming()
    live = stage_outputs(stack, streaming, streaming.stage("live", LiveStage), fits=False)
    unset = "FLOW_CHECKPOINTS (unset: in FLOW_HOME)"  # named as the user (did not) set it
    assert settings(live) == ["FLOW_HANDOFF", unset, "FLOW_WAREHOUSE"]
    assert live[1].where.uri == f"{stack.home}/checkpoints/ctr/ctr_streaming/live"
    assert [o.spark_checkpoint for o in live] == [False, True, False]
    elsewhere = replace(backfill, output=HandoffOutput("/x"))
    assert settings(stage_outputs(stack, elsewhere, stage, fits=False))[0] == (
        "HandoffOutput.location"
    )


@pytest.mark.parametrize("setting", ["FLOW_HANDOFF", "FLOW_FEATURE_STATE"])
def test_an_unwritable_location_fails_the_pipeline_before_any_spark_work(
    tmp_path: Path, setting: str
) -> None:
    # A regular file where the folder should be: unwritable even for root (chmod is not).
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {**clean_environ(), **stack_env_for(tmp_path / "home"), setting: str(blocker)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "pipelines/ctr_backfill.py", "--no-tracking"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [done.stderr.strip()], done.stderr
    assert done.stderr.startswith(f"error: {setting}: cannot write to {blocker}/ctr/")
    assert f"set {setting} to a location this process can write" in done.stderr
    assert time.monotonic() - started < 60
    assert not (tmp_path / "home" / "spark-warehouse").exists()
    assert not (tmp_path / "home" / "feature-state").exists(), "nothing was fitted"
