"""Delayed feedback: the training loss of channels whose labels arrive late, and which loss.

A channel labelled ``window`` emits an impression once its attribution window has closed, with
its final label: plain binary cross-entropy learns the click rate ``p``. A channel labelled
``immediate`` emits every impression at once as a negative and again, as a positive with the
same impression id, when its click comes within the window. Its rows follow a biased
distribution: for ``p`` clicks per impression there are ``1 + p`` rows, so

    b(y=1|x) = p / (1 + p),        b(y=0|x) = 1 / (1 + p),

and cross-entropy learns ``p / (1 + p)`` (a rate of 10% comes out as 9.1%).

The fake-negative weighted loss (FNW; Ktena et al. 2019, "Addressing Delayed Feedback for
Continuous Training with Neural Networks in CTR prediction") weighs each row by the importance
weight ``p(y|x) / b(y|x)`` with the model's own prediction ``f`` standing for ``p``:

    positives:  p / b(1|x) = 1 + f,          negatives:  (1 - p) / b(0|x) = (1 - f)(1 + f),
    loss = -[(1 + f) y log f + (1 - f)(1 + f)(1 - y) log(1 - f)],

the weights held constant (no gradient through them). Its expected gradient under ``b`` is
``(1 + f)(b0 - b1 / f)`` per row, zero exactly at ``f = b1 / b0 = p``: the model learns the
click rate. docs/trainers.md says why FNW rather than ES-DFM, and what breaks it.

A batch never mixes channels (each channel's reader cuts its own shuffle windows and a mixed
reader draws whole batches), so the correction is chosen per batch, by its channel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import nn

from flow.errors import ConfigError
from flow.training import DelayedFeedback

__all__ = [
    "Correction",
    "LabelStrategy",
    "Labels",
    "fnw_weights",
    "labels_for",
    "training_loss",
]

LabelStrategy = Literal["window", "immediate"]
Correction = Literal["fnw", "none"]


@dataclass(frozen=True)
class Labels:
    """How a channel's rows were labelled, and the correction the trainer applies to them."""

    strategy: LabelStrategy
    correction: Correction
    key: str | None = None
    """The column that ties an immediate channel's positive to its impression (the label
    join's key), when the channel has it: its metrics score impressions, not rows."""

    @property
    def immediate(self) -> bool:
        return self.strategy == "immediate"

    def describe(self) -> str:
        loss = "fake-negative weighted loss (FNW)" if self.correction == "fnw" else "plain BCE"
        if not self.immediate:
            return f"labels {self.strategy}, {loss}"
        scored = (
            f"AUC over impressions (key {self.key})"
            if self.key
            else "AUC over rows (pass the label join's key through to score impressions)"
        )
        return f"labels {self.strategy}, {loss}, {scored}"


def labels_for(
    setting: DelayedFeedback, strategy: str, channel: str, key: str | None = None
) -> Labels:
    """The correction ``setting`` (TrainConfig.delayed_feedback) gives a channel labelled by
    ``strategy`` (its ChannelMeta.label_strategy); ``key``: its label key column, if it has
    one."""
    if strategy not in get_args(LabelStrategy):
        raise ConfigError(
            f"channel {channel!r} says its labels are {strategy!r}; the trainer knows "
            f"{' and '.join(get_args(LabelStrategy))} (write the channel with labels="
            "{'strategy': 'window' | 'immediate'}, or update the trainer)"
        )
    known: LabelStrategy = "immediate" if strategy == "immediate" else "window"
    if setting == "off":
        correction: Correction = "none"
    elif setting == "fnw":
        correction = "fnw"
    else:
        correction = "fnw" if known == "immediate" else "none"
    return Labels(known, correction, key if known == "immediate" else None)


def fnw_weights(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FNW's importance weights of a row as a positive, ``1 + f``, and as a negative,
    ``(1 - f)(1 + f)``, with ``f = sigmoid(logit)`` held constant (detached)."""
    f = torch.sigmoid(logits.detach().float())
    return 1.0 + f, (1.0 - f) * (1.0 + f)


def training_loss(
    logits: torch.Tensor, batch: dict[str, torch.Tensor], correction: Correction = "none"
) -> torch.Tensor:
    """The mean loss of a batch: cross-entropy weighted by the row's ``weight`` column (when
    the channel has one) and, with ``fnw``, by FNW's importance weights as well.

    The two multiply: a row weight says how much an impression counts (e.g. the inverse of a
    sampling rate), FNW how over- or under-represented its labelled row is; an impression's
    fake negative and its positive carry the same row weight.
    """
    logits = logits.float()
    labels = batch["label"].float()
    weight = batch.get("weight")
    weights = weight.float() if weight is not None else None
    if correction == "none":
        return nn.functional.binary_cross_entropy_with_logits(logits, labels, weight=weights)
    if correction != "fnw":
        raise ConfigError(f"correction {correction!r}: use 'fnw' or 'none'")
    positive, negative = fnw_weights(logits)
    # -log f = softplus(-x), -log(1 - f) = softplus(x): stable for large |x|. Each term has its
    # own weight, so a label in (0, 1) splits exactly as it does in cross-entropy.
    softplus = nn.functional.softplus
    losses = positive * labels * softplus(-logits) + negative * (1.0 - labels) * softplus(logits)
    return (losses if weights is None else losses * weights).mean()
