"""``flow run --train``: the trainer's command line and the channels it follows."""

from __future__ import annotations

from pathlib import Path

import pytest

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.workflows.together import TrainerLaunch
from tests.support import Writer, stack_env_for


def test_the_trainer_follows_the_named_channels_of_its_namespace(tmp_path: Path) -> None:
    stack = StackConfig.from_env(stack_env_for(tmp_path))
    launch = TrainerLaunch("--namespace ctr --channel live --model dlrm", 2, stack, "run-1")
    assert launch.channels == ["live"]
    assert launch.handoff == f"{stack.handoff}/ctr"
    command = " ".join(launch.argv)
    assert "--nproc-per-node=2 -m trainers train --namespace ctr --channel live" in command
    assert "--follow" in launch.argv
    assert launch.argv[-2:] == ["--parent-run-id", "run-1"]
    Writer(launch.handoff, "live")
    launch.close_channels()
    assert (Path(launch.handoff) / "live" / "_closed").exists()


def test_a_trainer_without_channels_is_refused(tmp_path: Path) -> None:
    stack = StackConfig.from_env(stack_env_for(tmp_path))
    with pytest.raises(ConfigError, match="--channel live"):
        TrainerLaunch("--model dlrm", 1, stack, "run-1")
