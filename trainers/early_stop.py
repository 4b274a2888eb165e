"""Early stopping on the evaluation rows: stop when they stop improving, keep the best model.

:class:`EarlyStop` follows one evaluation figure (AUC up, or log loss down). Each evaluation
either sets a new best, whose weights it keeps, or counts one more without improvement; at
``patience`` of those in a row the run stops, and the session puts the best weights back before
it reports, evaluates and exports the model. The best weights live on the CPU in memory and,
with a checkpoint folder, in ``<folder>/best/model.pt`` too, so a resumed run still knows the
best and its weights. What it decides depends only on the figures it is given, which every rank
computes alike (evaluation gathers all ranks' predictions): the ranks stop together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from flow.errors import ConfigError
from flow.storage import Location
from flow.training import EarlyStopOn
from trainers.checkpoint import load_file, save_file

__all__ = ["Best", "EarlyStop"]


@dataclass
class Best:
    """The best evaluation so far and the step it came at."""

    step: int
    value: float
    scores: dict[str, float]


class EarlyStop:
    """Decides after each evaluation whether to go on, and keeps the best model's weights."""

    def __init__(
        self,
        patience: int,
        on: EarlyStopOn,
        folder: Location | None = None,
        *,
        writer: bool = True,
    ) -> None:
        self.patience = patience
        self.on = on
        self.folder = folder
        """Where the best weights are saved (a checkpoint folder's ``best/``), or None."""
        self.writer = writer
        """This rank writes ``best/`` (rank 0; the others only read it when resuming)."""
        self.best: Best | None = None
        self.stale = 0
        """Evaluations since the best one."""
        self._weights: dict[str, torch.Tensor] | None = None

    def better(self, value: float) -> bool:
        """Whether ``value`` improves on the best (a NaN never does)."""
        if math.isnan(value):
            return False
        if self.best is None:
            return True
        return value > self.best.value if self.on == "auc" else value < self.best.value

    def update(self, step: int, scores: dict[str, float], model: nn.Module) -> bool:
        """Record an evaluation of ``model`` (the plain model, not its DDP wrapper: its weights'
        names are the ones :meth:`restore` loads) at ``step``; True when the run is to stop."""
        value = float(scores.get(self.on, math.nan))
        if self.better(value):
            self.best = Best(step, value, dict(scores))
            self.stale = 0
            state = model.state_dict()
            self._weights = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
            self._save()
        else:
            self.stale += 1
        return self.stopped

    @property
    def stopped(self) -> bool:
        return self.stale >= self.patience

    def restore(self, model: nn.Module) -> Best | None:
        """Load the best weights into ``model``; the best, or None when there was none."""
        if self.best is None:
            return None
        weights = self._weights if self._weights is not None else self._load()
        model.load_state_dict(weights)
        return self.best

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (the weights are in ``best/``, not in every checkpoint)."""
        best = None if self.best is None else vars(self.best)
        return {"on": self.on, "best": best, "stale": self.stale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's :meth:`state_dict` (another figure followed: start
        afresh, since the old best says nothing about the new figure)."""
        if state.get("on") != self.on or state.get("best") is None:
            return
        self.best = Best(**state["best"])
        self.stale = int(state["stale"])
        self._weights = None  # read from best/ when needed

    def _where(self) -> Location | None:
        return None if self.folder is None else self.folder.child("best")

    def _save(self) -> None:
        where = self._where()
        if where is None or self.best is None or not self.writer:
            return
        save_file({"model": self._weights, "best": vars(self.best)}, where, "model.pt")

    def _load(self) -> dict[str, torch.Tensor]:
        where = self._where()
        if where is None or not where.exists("model.pt"):
            raise ConfigError(
                f"the best model of step {self.best.step if self.best else '?'} is not in "
                f"{where}/model.pt: was the checkpoint folder's best/ removed? Train again "
                "with --fresh"
            )
        saved = load_file(where, "model.pt")
        weights: dict[str, torch.Tensor] = saved["model"]
        return weights
