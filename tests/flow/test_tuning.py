"""The search space of ``flow tune``: parsed from --param and --space files, checked when built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flow.errors import ConfigError
from flow.training import TrainConfig
from flow.tuning import (
    DEFAULT_SPACE,
    Choices,
    Range,
    SearchSpace,
    TuneConfig,
    apply,
    build_space,
    parse_param,
)

BASE = TrainConfig(channels=("train",), eval_channel="heldout")


def test_a_param_is_a_range_a_log_range_or_choices_of_the_settings_type() -> None:
    assert parse_param("optim.lr=1e-4:1e-2:log") == Range("optim.lr", 1e-4, 1e-2, log=True)
    assert parse_param("model.dropout=0:0.3") == Range("model.dropout", 0.0, 0.3)
    dims = parse_param("model.embedding_dim=8,16,32")
    assert dims == Choices("model.embedding_dim", (8, 16, 32))
    assert all(type(v) is int for v in dims.values)
    assert parse_param("batch_size=256:4096:log").values == (256, 4096)  # whole numbers
    assert parse_param("model.name=dlrm,deepfm").values == ("dlrm", "deepfm")
    assert parse_param("optim.cowclip=true,false").values == (True, False)
    # The trainer's flag spelling works too.
    assert parse_param("--optim.embedding-lr=0.01:0.1").name == "optim.embedding_lr"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("optim.lrr=1e-4:1e-2", r"optim.lrr: not a trainer setting .*did you mean 'optim.lr'"),
        ("channels=a,b", r"channels: not a trainer setting flow tune can search"),
        ("model.hidden=8,16", r"model.hidden: not a trainer setting"),
        ("optim.lr", r"give NAME=SPEC"),
        ("optim.lr=0.1:0.01", r"the range 0.1:0.01 is empty; give low < high"),
        ("optim.lr=0:0.1:log", r"a log range starts above 0, not at 0.0"),
        ("optim.lr=1:2:3", r"give low:high or low:high:log"),
        ("model.embedding_dim=8,1.5", r"'1.5' is not a whole number"),
        ("model.name=dlrm,gbdt", r"'gbdt' is not one of deepfm, dlrm"),
        ("model.name=0:1", r"takes names; give choices: a,b,c"),
        ("batch_size=512,512", r"repeats a value"),
        ("optim.lr=fast", r"'fast' is not a number"),
    ],
)
def test_a_bad_param_is_refused_in_one_line_naming_it(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        parse_param(text)
    assert "\n" not in str(caught.value)


def test_params_override_the_default_space_and_one_value_fixes_a_setting() -> None:
    space = build_space(None, ["model.embedding_dim=16", "model.dropout=0:0.2"])
    specs = space.to_dict()
    assert specs["model.embedding_dim"] == "16"  # fixed, in the default's place
    assert specs["model.dropout"] == "0.0:0.2"  # new, last
    assert list(specs)[:-1] == list(DEFAULT_SPACE.to_dict())
    # The batch size is the derived one unless searched (docs/trainers.md, "Tuning").
    assert "batch_size" not in DEFAULT_SPACE.to_dict()
    assert specs["optim.lr"] == DEFAULT_SPACE.to_dict()["optim.lr"]


def test_a_space_file_replaces_the_default_and_takes_each_form(tmp_path: Path) -> None:
    path = tmp_path / "space.json"
    path.write_text(
        json.dumps(
            {
                "optim.lr": "1e-4:1e-2:log",
                "batch_size": [512, 1024],
                "optim.embedding_weight_decay": {"low": 1e-6, "high": 1e-3, "log": True},
            }
        )
    )
    space = build_space(path, ["batch_size=2048"])
    assert space == SearchSpace(
        (
            Range("optim.lr", 1e-4, 1e-2, log=True),
            Choices("batch_size", (2048,)),
            Range("optim.embedding_weight_decay", 1e-6, 1e-3, log=True),
        )
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1, 2]", r"give a JSON object"),
        ("{not json", r"is not valid JSON"),
        ('{"optim.lrate": "0.1:1"}', r"did you mean 'optim.lr'"),
        ('{"optim.lr": {"low": 0.1}}', r"a range is \{'low'"),
    ],
)
def test_a_bad_space_file_is_named(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "space.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        build_space(path, [])
    with pytest.raises(ConfigError, match=r"no such file"):
        build_space(tmp_path / "missing.json", [])


def test_values_the_trainer_refuses_fail_before_any_trial_with_its_reason() -> None:
    DEFAULT_SPACE.check(BASE)
    with pytest.raises(ConfigError, match=r"model.dropout=1.5: .*give a value in \[0, 1\)"):
        build_space(None, ["model.dropout=0:1.5"]).check(BASE)
    with pytest.raises(ConfigError, match=r"model.name=popularity: .*needs the sparse feature"):
        build_space(None, ["model.name=dlrm,popularity"]).check(BASE)


def test_applied_values_land_in_their_configs() -> None:
    config = apply(BASE, {"optim.lr": 0.02, "model.embedding_dim": 32, "batch_size": 512})
    assert (config.optim.lr, config.model.embedding_dim, config.batch_size) == (0.02, 32, 512)
    assert config.channels == BASE.channels
    assert config.optim.embedding_lr == BASE.optim.embedding_lr


def test_a_study_needs_trials_and_a_positive_timeout() -> None:
    with pytest.raises(ConfigError, match=r"--trials 0: give 1 or more"):
        TuneConfig(trials=0)
    with pytest.raises(ConfigError, match=r"--timeout -1.0: give seconds > 0"):
        TuneConfig(timeout_s=-1.0)
