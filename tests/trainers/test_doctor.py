from __future__ import annotations

import json

import pytest
import torch

from trainers.__main__ import main as trainers_main
from trainers.doctor import inspect_environment


def test_the_environment_report_matches_torch() -> None:
    env = inspect_environment()
    assert env.torch == torch.__version__
    assert env.cuda_available == torch.cuda.is_available()
    assert len(env.devices) == (torch.cuda.device_count() if env.cuda_available else 0)
    assert env.backend == ("nccl" if env.cuda_available and env.nccl else "gloo")


def test_require_gpu_fails_exactly_when_no_gpu_is_visible(
    capsys: pytest.CaptureFixture[str],
) -> None:
    expected = 0 if torch.cuda.is_available() else 1
    assert trainers_main(["doctor", "--require-gpu"]) == expected
    if expected:
        assert "no CUDA device is visible" in capsys.readouterr().out


def test_json_output_and_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert trainers_main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["torch"] == torch.__version__
    assert trainers_main(["serve"]) == 2  # not a command
    capsys.readouterr()
    assert trainers_main(["train"]) == 1  # no channel: one line saying which flag to give
    said = capsys.readouterr().err
    assert "error: name at least one channel to train on (--channel live)" in said
    with pytest.raises(SystemExit) as exited:
        trainers_main(["train", "--chanel", "live"])  # an unknown flag: a usage message
    assert exited.value.code == 2
