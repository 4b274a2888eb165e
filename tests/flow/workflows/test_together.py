"""``flow run --train``: the trainer's configuration, its file and the channels it follows."""

from __future__ import annotations

from pathlib import Path

import pytest

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.training import load_config, parse_args
from flow.workflows.together import TrainerLaunch
from tests.support import Writer, stack_env_for


def test_the_trainer_follows_the_named_channels_of_its_namespace(tmp_path: Path) -> None:
    stack = StackConfig.from_env(stack_env_for(tmp_path))
    config = parse_args(["--namespace", "ctr", "--channel", "live", "--model", "deepfm"])
    launch = TrainerLaunch(config, 2, stack, "run-1")
    assert launch.channels == ["live"]
    assert launch.handoff == f"{stack.handoff}/ctr"
    assert launch.argv[-2:] == ["--config", str(launch.file)]
    assert "--nproc-per-node=2" in launch.argv
    given = load_config(launch.file)  # what the trainer will run: the user's, following
    assert given.follow
    assert given.parent_run_id == "run-1"
    assert given.wait_for_channels >= 600
    assert given.model.name == "deepfm"
    assert given.handoff == launch.handoff
    assert given.checkpoint_dir == stack.checkpoints / "ctr" / "trainer" / "live"
    Writer(launch.handoff, "live")
    launch.close_channels()
    assert (Path(launch.handoff) / "live" / "_closed").exists()


def test_a_trainer_without_channels_is_refused() -> None:
    with pytest.raises(ConfigError, match="--channel live"):
        parse_args(["--model", "dlrm"])
