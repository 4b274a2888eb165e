"""Delayed feedback: the fake-negative weighted loss removes the bias of immediate labels.

Data with a known click model and exponential click delays are emitted as the ``immediate``
strategy emits them (tests/trainers/delayed.py); a logistic model trained on them with the
trainer's own loss learns p/(1+p) with plain cross-entropy and the click rate p with FNW.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from flow.errors import ConfigError
from tests.trainers.delayed import Impressions, Rows, immediate_rows, impressions
from trainers.feedback import Correction, fnw_weights, labels_for, training_loss
from trainers.metrics import BinaryMetrics


def fit(rows: Rows, correction: Correction, epochs: int = 3, batch: int = 1024) -> torch.nn.Module:
    """A logistic model over the rows in emission order, as a trainer following them sees
    them (three passes, to settle where each loss leads)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    x, y = torch.from_numpy(rows.features), torch.from_numpy(rows.label)
    for _ in range(epochs):
        for start in range(0, len(y), batch):
            logits = model(x[start : start + batch]).squeeze(1)
            loss = training_loss(logits, {"label": y[start : start + batch]}, correction)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
    return model


def predict(model: torch.nn.Module, features: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        logits: np.ndarray = model(torch.from_numpy(features)).squeeze(1).numpy()
    return logits


@pytest.fixture(scope="module")
def data() -> tuple[Impressions, Rows]:
    found = impressions(60_000, seed=0)
    return found, immediate_rows(found)


def test_immediate_rows_have_the_biased_positive_rate(data: tuple[Impressions, Rows]) -> None:
    found, rows = data
    rate = found.true_rate
    assert len(rows.label) == len(found.p_click) + found.clicked.sum()
    # P positives over N + P rows: the rate r comes out as r / (1 + r).
    assert rows.label.mean() == pytest.approx(rate / (1 + rate), rel=0.03)
    assert np.all(np.diff(rows.emitted_s) >= 0)


def test_fnw_learns_the_click_rate_where_cross_entropy_learns_p_over_1_plus_p(
    data: tuple[Impressions, Rows],
) -> None:
    found, rows = data
    true_rate = found.true_rate
    figures = {}
    for correction in ("none", "fnw"):
        model = fit(rows, correction)
        mean = float(np.mean(1 / (1 + np.exp(-predict(model, found.features)))))
        # Scored on the rows as a trainer scores an immediate channel's rows.
        metrics = BinaryMetrics()
        metrics.update(
            torch.from_numpy(predict(model, rows.features)),
            torch.from_numpy(rows.label),
            immediate=True,
        )
        figures[correction] = (mean, metrics.compute())
    biased, plain = figures["none"]
    corrected, fnw = figures["fnw"]
    p = found.p_click
    # Cross-entropy: biased low, to about p/(1+p) for each impression.
    assert biased < 0.85 * true_rate
    assert biased == pytest.approx(np.mean(p / (1 + p)), rel=0.05)
    assert plain["calibration_corrected"] < 0.85
    # FNW: the click rate, calibrated against the corrected count of positives.
    assert corrected == pytest.approx(true_rate, rel=0.10)
    assert 0.9 <= fnw["calibration_corrected"] <= 1.1
    # The rows' own positive rate, corrected (P over impressions), is the true rate.
    assert fnw["positive_rate_corrected"] == pytest.approx(true_rate, rel=0.10)
    assert fnw["positive_rate"] == pytest.approx(true_rate / (1 + true_rate), rel=0.05)


def test_the_fnw_gradient_vanishes_at_the_click_rate() -> None:
    # One impression type with p = 1/4: four impressions as fake negatives, one positive.
    p = 0.25
    logit = torch.tensor([np.log(p / (1 - p))] * 5, requires_grad=True)
    labels = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0])
    training_loss(logit, {"label": labels}, "fnw").backward()  # type: ignore[no-untyped-call]
    assert logit.grad is not None
    assert float(logit.grad.sum()) == pytest.approx(0.0, abs=1e-7)
    # Plain cross-entropy's gradient vanishes at 1/5 = p/(1+p) instead.
    biased = torch.tensor([np.log(0.2 / 0.8)] * 5, requires_grad=True)
    training_loss(biased, {"label": labels}, "none").backward()  # type: ignore[no-untyped-call]
    assert biased.grad is not None
    assert float(biased.grad.sum()) == pytest.approx(0.0, abs=1e-7)


def test_fnw_weighs_rows_by_the_papers_importance_weights_times_the_row_weight() -> None:
    logits = torch.tensor([-1.0, 0.5, 2.0, -0.3])
    labels = torch.tensor([1.0, 0.0, 1.0, 0.0])
    weight = torch.tensor([1.0, 2.0, 0.5, 3.0])
    f = torch.sigmoid(logits)
    positive, negative = fnw_weights(logits)
    assert torch.allclose(positive, 1 + f)
    assert torch.allclose(negative, (1 - f) * (1 + f))
    expected = -(
        weight
        * ((1 + f) * labels * torch.log(f) + (1 - f) * (1 + f) * (1 - labels) * torch.log(1 - f))
    ).mean()
    found = training_loss(logits, {"label": labels, "weight": weight}, "fnw")
    assert float(found) == pytest.approx(float(expected), rel=1e-6)
    # The weights are constants: the gradient is the weighted cross-entropy's.
    x = logits.clone().requires_grad_(True)
    training_loss(x, {"label": labels, "weight": weight}, "fnw").backward()  # type: ignore[no-untyped-call]
    per_row = torch.where(labels == 1, positive, negative) * weight
    assert x.grad is not None
    assert torch.allclose(x.grad, per_row * (f - labels) / 4)


def test_plain_cross_entropy_is_unchanged_with_and_without_row_weights() -> None:
    logits = torch.tensor([-1.0, 0.5, 2.0])
    labels = torch.tensor([1.0, 0.0, 1.0])
    weight = torch.tensor([1.0, 2.0, 0.5])
    assert torch.equal(
        training_loss(logits, {"label": labels}), F.binary_cross_entropy_with_logits(logits, labels)
    )
    assert torch.equal(
        training_loss(logits, {"label": labels, "weight": weight}, "none"),
        F.binary_cross_entropy_with_logits(logits, labels, weight=weight),
    )


def test_auto_corrects_exactly_the_immediate_channels() -> None:
    assert labels_for("auto", "immediate", "live").correction == "fnw"
    assert labels_for("auto", "window", "backfill").correction == "none"
    assert labels_for("off", "immediate", "live").correction == "none"
    assert labels_for("fnw", "window", "backfill").correction == "fnw"
    assert labels_for("auto", "immediate", "live").immediate
    with pytest.raises(ConfigError, match=r"labels are 'delayed'.*window and immediate"):
        labels_for("auto", "delayed", "live")
