"""Optimizers for CTR models: embedding tables and dense layers each with their own kind.

Embedding tables and MLPs want different things: a table row is updated only when its id
appears, so Adagrad (or Adam with its own learning rate) per row is usual, while the MLPs see
every step. :func:`build_optimizer` gives the two parameter groups their own kind and learning
rate and returns one ``torch.optim.Optimizer`` either way, so LR schedulers, checkpoints and the
training loop do not care whether one or two optimizers run underneath.

:class:`CowClip` clips embedding gradients row by row (Zheng et al., AAAI 2023), for large-batch
training; call it between ``backward()`` and ``step()``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, overload

import torch
from torch import Tensor

from flow.errors import ConfigError
from flow.training import OptimConfig
from trainers.models import CTRModel

__all__ = [
    "CombinedOptimizer",
    "CowClip",
    "OptimConfig",
    "build_optimizer",
    "cowclip_",
]


_KINDS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adam": torch.optim.Adam,
    "adagrad": torch.optim.Adagrad,
    "sgd": torch.optim.SGD,
}


class CombinedOptimizer(torch.optim.Optimizer):
    """Several optimizers over disjoint parameters, used as one.

    ``param_groups`` is the list of the parts' own group dicts, so an LR scheduler that sets
    ``group["lr"]`` changes the part's optimizer. ``state_dict()`` holds each part's state dict
    under its name; ``load_state_dict`` needs the same names.
    """

    def __init__(self, parts: Mapping[str, torch.optim.Optimizer]) -> None:
        if not parts:
            raise ConfigError("CombinedOptimizer needs at least one optimizer")
        self.parts = dict(parts)
        params = [p for o in self.parts.values() for g in o.param_groups for p in g["params"]]
        # The base class checks that no parameter is in two parts; its own groups are replaced.
        super().__init__(params, {})
        self._share_groups()

    def _share_groups(self) -> None:
        self.param_groups = [g for o in self.parts.values() for g in o.param_groups]

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            # Evaluated once for all parts; optimizers that re-evaluate (LBFGS) do not fit here.
            with torch.enable_grad():
                loss = closure()
        for optimizer in self.parts.values():
            optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.parts.values():
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {name: optimizer.state_dict() for name, optimizer in self.parts.items()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        if set(state_dict) != set(self.parts):
            raise ConfigError(
                f"the optimizer state has parts {sorted(state_dict)}; this optimizer has "
                f"{sorted(self.parts)} (was the checkpoint saved with other optimizer kinds?)"
            )
        for name, optimizer in self.parts.items():
            optimizer.load_state_dict(state_dict[name])
        # Loading replaces each part's group dicts: share the new ones.
        self._share_groups()


def build_optimizer(
    model: CTRModel, config: OptimConfig, *, capturable: bool = False
) -> torch.optim.Optimizer:
    """One optimizer over ``model``: group ``embedding`` (the tables) and group ``dense``.

    With the same kind for both, a single torch optimizer with two param groups; otherwise a
    :class:`CombinedOptimizer` of one optimizer per kind. Each group carries its ``name``.
    ``capturable``: state on the device, so ``step()`` can be captured in a CUDA graph
    (``trainers.graphed``); only Adam keeps its step count there.
    """
    if capturable and {config.embedding, config.dense} != {"adam"}:
        raise ConfigError(
            f"a CUDA graph step needs Adam for both groups (embedding={config.embedding!r}, "
            f"dense={config.dense!r}); set both to 'adam' or turn the graph off"
        )
    embedding_decay = config.embedding_weight_decay
    groups = {
        "embedding": (
            config.embedding,
            config.embedding_lr or config.lr,
            config.weight_decay if embedding_decay is None else embedding_decay,
        ),
        "dense": (config.dense, config.lr, config.weight_decay),
    }
    params = {"embedding": model.embedding_parameters(), "dense": model.dense_parameters()}
    parts: dict[str, list[dict[str, Any]]] = {}
    for name, (kind, lr, decay) in groups.items():
        if params[name]:
            group = {"params": params[name], "lr": lr, "weight_decay": decay, "name": name}
            parts.setdefault(kind, []).append(group)
    optimizers = {
        kind: _KINDS[kind](
            part,
            lr=config.lr,
            weight_decay=config.weight_decay,
            **({"capturable": True} if capturable else {}),
        )
        for kind, part in parts.items()
    }
    if len(optimizers) == 1:
        return next(iter(optimizers.values()))
    # Named by group, not kind, so a checkpoint says which state belongs to which parameters.
    return CombinedOptimizer(
        {group["name"]: optimizers[kind] for kind, part in parts.items() for group in part}
    )


def cowclip_(grad: Tensor, weight: Tensor, rows: Tensor, ratio: float, min_norm: float) -> Tensor:
    """Clip the gradient rows ``rows`` of a table in place, CowClip's rule; returns ``grad``.

    For each distinct row ``i`` of ``rows`` (``cnt_i`` = how often it appears there)::

        g_i <- g_i * min(1, cnt_i * max(r * ||w_i||, ζ) / ||g_i||)

    Rows not in ``rows`` are left alone: a row no id of the batch read has no gradient from it.
    Counts are scattered into a table-sized buffer rather than found with ``torch.unique``,
    whose output size the host must wait for: on a GPU that wait would stall every step. A row
    read twice is computed twice, to the same value.
    """
    if rows.numel() == 0:
        return grad
    counts = torch.zeros(weight.shape[0], dtype=torch.float32, device=rows.device)
    counts.index_add_(0, rows, torch.ones(rows.shape, dtype=torch.float32, device=rows.device))
    g = grad.index_select(0, rows)
    weight_norm = weight.detach().index_select(0, rows).float().norm(dim=1)
    threshold = counts.index_select(0, rows) * (ratio * weight_norm).clamp(min=min_norm)
    grad_norm = g.float().norm(dim=1)
    scale = (threshold / grad_norm.clamp(min=torch.finfo(grad_norm.dtype).tiny)).clamp(max=1.0)
    grad.index_copy_(0, rows, g * scale.unsqueeze(1).to(g.dtype))
    return grad


@dataclass(frozen=True)
class CowClip:
    """Adaptive column-wise clipping of embedding gradients (Zheng et al., "CowClip: Reducing CTR
    Prediction Model Training Time from 12 hours to 10 minutes on 1 GPU", AAAI 2023, Alg. 1).

    Each id's embedding row ``w_i`` gets its gradient ``g_i`` clipped to a norm that grows with
    the row's own norm and with how often the id occurs in the batch::

        clip_i = cnt_i * max(r * ||w_i||, ζ)
        g_i   <- min(1, clip_i / ||g_i||) * g_i

    ``cnt_i`` counts the id's uses in the batch (sequence padding excluded); ``ζ`` keeps rows
    near zero (new ids, zero-initialised first-order weights) from being frozen. The official
    code (bytedance/LargeBatchCTR) computes ``r * cnt_i * max(||w_i||, ζ)``; the two agree at
    the paper's r = 1. ``g_i`` is the gradient as ``backward()`` left it, so the threshold is
    in the units of the trainer's loss (a batch mean, as usual). Every table of the model is
    clipped, the 1-wide first-order tables included. Only rows the batch read are touched:
    counts scattered, then gathers and one ``index_copy_``, no Python loop and no wait for
    the device.

    The paper's scaling rule for a batch ``s`` times larger (its code's Criteo settings):
    the embedding learning rate unchanged, the dense learning rate times ``sqrt(s)`` with a
    warm-up, the embedding L2 penalty times ``s`` (:meth:`OptimConfig.scaled_for`).

    Usage::

        loss.backward()
        clip.apply(model, batch)
        optimizer.step()

    Counts come from ``batch``, which must be what the gradient was computed on: with gradient
    accumulation, call it once before ``step()`` with the micro-batches' columns concatenated.
    Under DDP the counts are the local batch's while the gradient is the all-reduced one (the
    paper ran on one GPU).
    """

    ratio: float = 1.0
    """r, the ratio of gradient norm to weight norm allowed per occurrence."""
    min_norm: float = 1e-5
    """ζ, the lower bound of the per-occurrence threshold."""

    @classmethod
    def from_config(cls, config: OptimConfig) -> CowClip | None:
        """The clipping ``config`` asks for, or None when ``config.cowclip`` is off."""
        return cls(config.cowclip_ratio, config.cowclip_min) if config.cowclip else None

    @torch.no_grad()
    def apply(self, model: CTRModel, batch: Mapping[str, Tensor]) -> None:
        """Clip the gradients of every embedding table of ``model`` for ``batch``."""
        for weight, rows in model.embedding_rows(batch):
            if weight.grad is None:
                continue
            if weight.grad.is_sparse:
                raise ConfigError("CowClip needs dense embedding gradients (sparse=False)")
            cowclip_(weight.grad, weight, rows, self.ratio, self.min_norm)
