"""Early stopping: the evaluation rows decide when to stop, and the best model is the result."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from flow.errors import ConfigError
from flow.storage import location
from flow.training import ModelConfig, OptimConfig, TrainConfig
from tests.trainers.channels import write
from tests.trainers.test_train import config
from trainers.early_stop import EarlyStop
from trainers.train import train


def weights(value: float) -> nn.Linear:
    layer = nn.Linear(1, 1)
    with torch.no_grad():
        layer.weight.fill_(value)
    return layer


def test_patience_counts_evaluations_without_improvement_and_restore_gives_the_best() -> None:
    early = EarlyStop(patience=2, on="auc")
    assert not early.update(10, {"auc": 0.70}, weights(1.0))
    assert not early.update(20, {"auc": 0.75}, weights(2.0))
    assert not early.update(30, {"auc": 0.74}, weights(3.0))
    assert not early.update(40, {"auc": 0.76}, weights(4.0))  # improves: the count starts again
    assert not early.update(50, {"auc": math.nan}, weights(5.0))  # no figure is no improvement
    assert early.update(60, {"auc": 0.76}, weights(6.0))  # equal is not better
    model = weights(0.0)
    best = early.restore(model)
    assert best is not None
    assert best.step == 40
    assert model.weight.item() == 4.0


def test_log_loss_improves_downwards() -> None:
    early = EarlyStop(patience=1, on="logloss")
    early.update(1, {"logloss": 0.30}, weights(1.0))
    assert not early.update(2, {"logloss": 0.29}, weights(2.0))
    assert early.update(3, {"logloss": 0.31}, weights(3.0))
    assert early.best is not None
    assert early.best.step == 2


def test_the_best_survives_in_the_checkpoint_folder(tmp_path: Path) -> None:
    early = EarlyStop(patience=3, on="auc", folder=location(str(tmp_path)))
    early.update(5, {"auc": 0.8}, weights(7.0))
    early.update(6, {"auc": 0.7}, weights(8.0))
    again = EarlyStop(patience=3, on="auc", folder=location(str(tmp_path)))
    again.load_state_dict(early.state_dict())
    assert again.stale == 1
    model = weights(0.0)
    assert again.restore(model) is not None
    assert model.weight.item() == 7.0


def test_early_stop_needs_rows_to_judge_on(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--eval-channel NAME or --holdout-share"):
        config(tmp_path, early_stop=2)
    with pytest.raises(ConfigError, match="--early-stop -1"):
        config(tmp_path, early_stop=-1, eval_channel="heldout")
    assert config(tmp_path, early_stop=0, eval_channel="heldout").effective_early_stop is None


def overfitting(tmp_path: Path, **changes: object) -> TrainConfig:
    """A logistic model with a weight per row (the user column numbers the rows), trained for
    many epochs with a large step: it learns the item signal, then memorises the rows."""
    base: dict[str, object] = {
        "model": ModelConfig("logistic"),
        "optim": OptimConfig(lr=0.05, embedding_lr=0.5),
        "eval_channel": "heldout",
        "epochs": 30,
        "batch_size": 256,
        "early_stop": 1,
        "early_stop_on": "logloss",
    }
    return config(tmp_path, **(base | changes))


def test_a_run_stops_when_the_evaluation_stops_improving_and_reports_the_best_model(
    tmp_path: Path,
) -> None:
    write(tmp_path, "train", [1000, 1000])
    write(tmp_path, "heldout", [1000], seed=99)
    said: list[str] = []
    result = train(overfitting(tmp_path), say=said.append)
    steps_per_epoch = 2000 // 256
    assert result.stopped_early
    assert result.steps < 30 * steps_per_epoch
    assert result.best_step is not None
    assert result.best_step < result.steps
    line = next(s for s in said if s.startswith("early stopping: the model of step"))
    best = float(re.search(r"logloss ([0-9.]+)", line).group(1))  # type: ignore[union-attr]
    # The run's model (evaluated, and exported with tracking) is the best one, not the last.
    assert result.metrics["logloss"] == pytest.approx(best, abs=1e-4)
    # The headline, the run's last figures, are the kept model's, and say which step it is.
    headline = next(s for s in said if s.startswith("evaluation: "))
    assert f"log loss {result.metrics['logloss']:.4f}" in headline
    assert f"step {result.best_step} of {result.steps}, the best evaluated, kept" in headline
    # Each evaluation has its line, with the figure early stopping goes by.
    evaluations = [s for s in said if s.startswith("evaluation at step ")]
    assert len(evaluations) >= 2  # patience 1: the best, then one without improvement
    assert f"the best so far: step {result.best_step}, logloss" in evaluations[-1]
    assert (tmp_path / "checkpoints" / "best" / "model.pt").exists()

    with pytest.raises(ConfigError, match=r"stopped early at step .*larger --early-stop"):
        train(overfitting(tmp_path), say=lambda _: None)
    longer = train(overfitting(tmp_path, early_stop=3), say=lambda _: None)
    assert longer.resumed_from == result.steps
    assert longer.steps > result.steps
    fresh = train(overfitting(tmp_path, fresh=True), say=lambda _: None)
    assert fresh.resumed_from is None
    assert fresh.best_step == result.best_step  # the same seeded run again


def test_small_data_with_the_defaults_gets_a_derived_batch_and_early_stopping(
    tmp_path: Path,
) -> None:
    """No --batch-size and no --early-stop: 2,000 rows train in batches of 32 (not one step
    of 4,096 an epoch), and the eval channel turns early stopping on."""
    write(tmp_path, "train", [1000, 1000])
    write(tmp_path, "heldout", [1000], seed=99)
    said: list[str] = []
    run = config(tmp_path, batch_size=None, eval_channel="heldout", epochs=3)
    result = train(run, say=said.append)
    assert "batch size 32: derived from 2,000 training rows (~62 steps an epoch); give " in (
        "\n".join(said)
    )
    assert result.steps == 3 * -(-2000 // 32)  # the last batch of an epoch is partial
    assert result.best_step is not None  # early stopping judged the epochs
    assert any(s.startswith("evaluation: AUC ") for s in said)
