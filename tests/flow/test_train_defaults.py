"""The settings a training run derives when they are not given (issue 48, "defaults that
learn"): the batch size from the training rows, early stopping with an eval channel."""

from __future__ import annotations

from pathlib import Path

import pytest

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.train_defaults import (
    DEFAULT_BATCH_SIZE,
    MIN_BATCH_SIZE,
    STEPS_PER_EPOCH,
    derived_batch_size,
)
from flow.training import DEFAULT_EVAL_EPOCHS, TrainConfig, parse_args, with_batch_size
from tests.support import stack_env_for
from tests.trainers.channels import write


@pytest.mark.parametrize(
    "rows", [0, 1, 800, 9_599, 9_600, 19_000, 76_800, 100_000, 1_228_800, 10**7, 10**10]
)
def test_a_derived_batch_is_a_power_of_two_with_a_few_hundred_steps_an_epoch(rows: int) -> None:
    size = derived_batch_size(rows)
    assert size & (size - 1) == 0
    assert MIN_BATCH_SIZE <= size <= DEFAULT_BATCH_SIZE
    if size > MIN_BATCH_SIZE:
        assert rows // size >= STEPS_PER_EPOCH  # never fewer steps than aimed at...
    if size < DEFAULT_BATCH_SIZE:
        assert rows // (2 * size) < STEPS_PER_EPOCH  # ...and the largest batch that gives them


def test_small_data_gets_small_batches_and_unknown_rows_the_default() -> None:
    assert derived_batch_size(800) == MIN_BATCH_SIZE
    assert derived_batch_size(40_000) == 128
    assert derived_batch_size(None) == DEFAULT_BATCH_SIZE


def test_the_batch_is_derived_from_the_committed_rows_and_a_given_one_wins(
    tmp_path: Path,
) -> None:
    write(tmp_path, "train", [20_000, 20_000])
    base = TrainConfig(channels=("train",), handoff=str(tmp_path))
    sized, line = with_batch_size(base)
    assert sized.batch_size == 128
    assert line is not None
    assert "40,000 training rows" in line
    assert "--batch-size" in line
    # The rows it will read: the commits after --after-commit, less the held-out share.
    assert with_batch_size(TrainConfig(**{**vars(base), "after_commit": 0}))[0].batch_size == 64
    held = TrainConfig(**{**vars(base), "holdout_share": 0.5})
    assert with_batch_size(held)[0].batch_size == 64
    given = TrainConfig(channels=("train",), handoff=str(tmp_path), batch_size=1000)
    assert with_batch_size(given) == (given, None)
    followed, said = with_batch_size(TrainConfig(**{**vars(base), "follow": True}))
    assert followed.batch_size == DEFAULT_BATCH_SIZE
    assert said is not None
    assert "not known ahead" in said


def test_the_derived_batch_names_the_checkpoint_folder(tmp_path: Path) -> None:
    """The checkpoint folder is named by the effective settings: other data, another size,
    another folder; the same data, the same folder as the size given outright."""
    write(tmp_path, "train", [20_000, 20_000])
    stack = StackConfig.from_env(stack_env_for(tmp_path))
    derived = TrainConfig(channels=("train",), handoff=str(tmp_path)).resolved(stack)
    given = TrainConfig(channels=("train",), handoff=str(tmp_path), batch_size=128)
    assert derived.checkpoint_dir == given.resolved(stack).checkpoint_dir
    other = TrainConfig(channels=("train",), handoff=str(tmp_path), batch_size=64)
    assert derived.checkpoint_dir != other.resolved(stack).checkpoint_dir


def test_early_stopping_is_on_with_an_eval_channel_and_zero_turns_it_off() -> None:
    def patience(*flags: str) -> int | None:
        return parse_args(["--channel", "train", *flags]).effective_early_stop

    assert patience() is None
    assert patience("--eval-channel", "heldout") == 2
    assert patience("--eval-channel", "heldout", "--early-stop", "5") == 5
    assert patience("--eval-channel", "heldout", "--early-stop", "0") is None
    # A followed channel has no epochs to evaluate at: on only with --eval-every.
    assert patience("--eval-channel", "heldout", "--follow") is None
    assert patience("--eval-channel", "heldout", "--follow", "--eval-every", "100") == 2


def test_with_early_stopping_on_the_held_out_rows_choose_the_epochs() -> None:
    """One pass left the deep models 0.02 AUC short of the epochs the holdout chooses: with an
    eval channel and no --epochs, a run trains up to DEFAULT_EVAL_EPOCHS and stops early."""

    def epochs(*flags: str) -> int:
        return parse_args(["--channel", "train", *flags]).effective_epochs

    assert epochs() == 1
    assert epochs("--eval-channel", "heldout") == DEFAULT_EVAL_EPOCHS
    assert epochs("--eval-channel", "heldout", "--epochs", "3") == 3
    assert epochs("--eval-channel", "heldout", "--early-stop", "0") == 1
    assert epochs("--holdout-share", "0.1") == 1  # no early stopping asked for: one pass
    assert epochs("--holdout-share", "0.1", "--early-stop", "2") == DEFAULT_EVAL_EPOCHS
    assert epochs("--eval-channel", "heldout", "--follow", "--eval-every", "100") == 1
    # Several passes bring the embedding L2 default with them, as --epochs 10 does.
    derived = parse_args(["--channel", "train", "--eval-channel", "heldout"])
    given = parse_args(["--channel", "train", "--eval-channel", "heldout", "--epochs", "10"])
    assert derived.effective_optim == given.effective_optim
    with pytest.raises(ConfigError, match="--epochs 0"):
        parse_args(["--channel", "train", "--epochs", "0"])
