"""The baselines: hashed logistic regression and popularity, in the trainer's own loop."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from flow.errors import ConfigError
from flow.training import ModelConfig, OptimConfig
from tests.trainers.channels import LAYOUT, write
from tests.trainers.test_models import random_batch
from tests.trainers.test_train import config
from trainers.baselines import Popularity
from trainers.export import CTRPredictor, batch_from_frame, example_frame, save_model
from trainers.models import build_model
from trainers.train import train

POPULARITY = ModelConfig("popularity", field="item", smoothing=4.0)


def test_popularity_predicts_the_smoothed_click_rate_of_its_field() -> None:
    model = build_model(POPULARITY, LAYOUT)
    assert isinstance(model, Popularity)
    batch = random_batch(LAYOUT, size=6)
    batch["sparse"][:, 1] = torch.tensor([3, 3, 3, 3, 7, 7])
    batch["label"] = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    before = model(batch)  # scored before it is counted: progressive validation stays honest
    assert torch.allclose(before, torch.zeros(6))
    model.eval()
    rates = model.rates(batch)
    prior = (3 + 1) / (6 + 2)
    torch.testing.assert_close(rates[0], torch.tensor((3 + 4 * prior) / (4 + 4)))
    torch.testing.assert_close(rates[4], torch.tensor((0 + 4 * prior) / (2 + 4)))
    unseen = dict(batch, sparse=batch["sparse"].clone())
    unseen["sparse"][:, 1] = 20
    torch.testing.assert_close(model.rates(unseen), torch.full((6,), prior))
    model(batch)  # evaluation does not count
    torch.testing.assert_close(model.rates(batch), rates)


def test_popularity_counts_rows_by_their_weight() -> None:
    model = build_model(POPULARITY, LAYOUT)
    batch = random_batch(LAYOUT, size=2)
    batch["sparse"][:, 1] = 5
    batch["label"] = torch.tensor([1.0, 0.0])
    batch["weight"] = torch.tensor([3.0, 1.0])
    model(batch)
    counts = model.embeddings.weight[5]
    torch.testing.assert_close(counts, torch.tensor([3.0, 4.0]))


def test_popularity_needs_a_sparse_field_of_the_layout() -> None:
    with pytest.raises(ConfigError, match=r"--model.field item_id"):
        ModelConfig("popularity")
    with pytest.raises(ConfigError, match=r"choose one of user, item, country"):
        build_model(ModelConfig("popularity", field="age"), LAYOUT)
    with pytest.raises(ConfigError, match="only the popularity model reads it"):
        ModelConfig("dlrm", field="item")


def test_logistic_is_one_weight_per_id_and_per_dense_value() -> None:
    model = build_model(ModelConfig("logistic"), LAYOUT)
    assert model.embeddings.weight.shape == (50 + 40 + 8, 1)
    batch = random_batch(LAYOUT, size=4)
    assert torch.equal(model(batch), torch.zeros(4))  # no opinion before training
    with torch.no_grad():
        model.embeddings.weight[50 + 7] = 2.0  # item 7
    batch["sparse"][:, 1] = torch.tensor([7, 7, 1, 1])
    assert model(batch).tolist() == [2.0, 2.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "model",
    [ModelConfig("logistic"), ModelConfig("popularity", field="item")],
    ids=["logistic", "popularity"],
)
def test_a_baseline_trains_evaluates_and_learns_the_planted_signal(
    tmp_path: Path, model: ModelConfig
) -> None:
    write(tmp_path, "train", [3000, 3000])
    write(tmp_path, "heldout", [2000], seed=99)
    cfg = config(
        tmp_path,
        model=model,
        optim=OptimConfig(lr=0.01, embedding_lr=0.1),
        eval_channel="heldout",
        batch_size=256,
    )
    result = train(cfg, say=lambda _: None)
    # Clicks depend on the item (and on price, which only the logistic model reads).
    assert result.metrics["auc"] > 0.7, result.metrics
    assert 0.8 < result.metrics["calibration"] < 1.25, result.metrics
    assert result.metrics["count"] == 2000


@pytest.mark.parametrize(
    "model",
    [ModelConfig("logistic"), ModelConfig("popularity", field="item")],
    ids=["logistic", "popularity"],
)
def test_a_baseline_exports_and_predicts_as_it_did_in_training(
    tmp_path: Path, model: ModelConfig
) -> None:
    trained = build_model(model, LAYOUT)
    batch = random_batch(LAYOUT, size=64)
    batch["sparse"][:32, 1] = 1  # the example frame's item: its count must travel
    trained(batch)  # the popularity model counts the rows
    with torch.no_grad():
        for parameter in trained.parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    path = save_model(trained, LAYOUT, tmp_path / "model.pt")
    predictor = CTRPredictor()
    predictor.load_context(SimpleNamespace(artifacts={"model": str(path)}))
    frame = example_frame(LAYOUT, rows=3)
    with torch.no_grad():
        expected = torch.sigmoid(trained.eval()(batch_from_frame(frame, LAYOUT))).numpy()
    found = predictor.predict(None, frame)
    assert found.shape == (3,)
    assert not math.isnan(float(found.sum()))
    torch.testing.assert_close(torch.from_numpy(found), torch.from_numpy(expected))
