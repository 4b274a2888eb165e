"""Baselines measured by the trainer itself: hashed logistic regression and item popularity.

A deep model is worth its cost only by what it adds over these, so they run in the same loop
on the same rows and report the same figures (``--model logistic``, ``--model popularity
--model.field item_id``): a comparison made by other code, on another split, says little.
Both read the batch contract of ``trainers.models`` and are :class:`CTRModel` s, so the
optimizer, checkpoints, evaluation and the MLflow export treat them like the others.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import Tensor, nn

from flow.errors import ConfigError
from flow.pipeline.state import Layout
from flow.training import ModelConfig
from trainers.models import CTRModel

__all__ = ["Logistic", "Popularity"]


class Logistic(CTRModel):
    """Hashed logistic regression: ``logit = b + Σ_f w_f[id_f] + Σ_k a_k x_k``.

    One weight per row of each categorical field's table (hashed down to ``max_embedding_rows``
    like the other models' tables, so the same ids share a weight as they share a vector there),
    a sequence adding the mean of its ids' weights, and a linear layer over the dense block.
    The tables are the model's embedding tables (width 1), so the embedding optimizer and its
    learning rate apply to them as to the deep models' tables. Everything starts at zero: the
    first prediction is 0.5 and no id has an opinion before it is seen.
    """

    def __init__(self, config: ModelConfig, layout: Layout) -> None:
        super().__init__(config, layout, width=1, init_std=0.0)
        self.dense = nn.Linear(self.n_dense, 1, bias=False) if self.n_dense else None
        if self.dense is not None:
            nn.init.zeros_(self.dense.weight)
        self.bias = nn.Parameter(torch.zeros(1))

    def logits(self, batch: Mapping[str, Tensor]) -> Tensor:
        terms: list[Tensor] = []  # the layout has a feature: never empty
        if self.embeddings.n_fields:
            terms.append(self.embeddings(batch).sum(dim=(1, 2)))
        if self.dense is not None:
            terms.append(self.dense(self._dense(batch)).squeeze(1))
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        return total + self.bias


class Popularity(CTRModel):
    """The smoothed click rate of one sparse field's value, counted over the training rows.

    For value ``v`` with ``clicks_v`` clicks in ``shown_v`` rows, and the overall rate ``p``::

        rate_v = (clicks_v + m p) / (shown_v + m)        m = ModelConfig.smoothing

    A value never seen predicts ``p``; one seen often, its own rate. The logit is
    ``scale * logit(rate_v) + shift``, two parameters the loop trains (from 1 and 0): a
    calibration on top of counts, which leaves the counts, and so the ranking within the field,
    to the data alone. Counting happens in the forward of a training step, after the batch is
    scored, so progressive validation sees each row before it is counted; evaluation, export
    and frozen copies (``eval()`` mode) never count. Rows count with their ``weight`` column
    where the channel has one; labels count as given (on a channel labelled ``immediate`` that
    is the biased rate: use a channel with final labels). Each epoch counts its rows again,
    which leaves rates as they were but weakens the smoothing.

    The counts (clicks, rows) per table row live in the model's one embedding table, of width
    2, frozen: they are saved, resumed, exported and hashed (``max_embedding_rows``) like any
    table. Under DDP every rank adds every rank's counts (one all-reduce per training step), so
    the ranks stay identical.
    """

    def __init__(self, config: ModelConfig, layout: Layout) -> None:
        names = [name for name, _ in layout.sparse]
        if config.field not in names:
            choices = ", ".join(names) or "(none: the layout has no sparse features)"
            raise ConfigError(
                f"ModelConfig.field is {config.field!r}, which is no sparse feature of the "
                f"channel's layout; choose one of {choices}"
            )
        self.column = names.index(config.field)
        counted = Layout(dense=(), sparse=(layout.sparse[self.column],), sequences=())
        super().__init__(config, layout, tables=counted, width=2, init_std=0.0)
        self.embeddings.weight.requires_grad_(False)
        self.scale = nn.Parameter(torch.ones(1))
        self.shift = nn.Parameter(torch.zeros(1))
        self.totals: Tensor
        self.register_buffer("totals", torch.zeros(2))

    def rates(self, batch: Mapping[str, Tensor]) -> Tensor:
        """The smoothed click rate of each row's value, from the counts so far."""
        rows = self._table_rows(batch)
        counts = self.embeddings.weight.detach()[rows]
        clicks, shown = self.totals.unbind()
        prior = (clicks + 1.0) / (shown + 2.0)  # the overall rate, itself smoothed
        m = self.config.smoothing
        rate: Tensor = (counts[:, 0] + m * prior) / (counts[:, 1] + m)
        return rate

    def logits(self, batch: Mapping[str, Tensor]) -> Tensor:
        logit = self.scale * torch.logit(self.rates(batch)) + self.shift
        if self.training:
            self.count(batch)
        return logit

    def _table_rows(self, batch: Mapping[str, Tensor]) -> Tensor:
        values = batch["sparse"][:, self.column].to(self.embeddings.weight.device, torch.long)
        return values % self.embeddings.rows[0]

    @torch.no_grad()
    def count(self, batch: Mapping[str, Tensor]) -> None:
        """Add the batch's rows to the counts (every rank's, under DDP)."""
        weight = self.embeddings.weight
        rows = self._table_rows(batch)
        label = batch["label"].to(weight.device, weight.dtype)
        given = batch.get("weight")
        shown = torch.ones_like(label) if given is None else given.to(weight.device, weight.dtype)
        values = torch.stack([label * shown, shown], dim=1)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            added = torch.zeros_like(weight)
            added.index_add_(0, rows, values)
            dist.all_reduce(added)
            weight.add_(added)
            self.totals.add_(added.sum(dim=0))
        else:
            weight.index_add_(0, rows, values)
            self.totals.add_(values.sum(dim=0))
