"""Streaming evaluation metrics of a binary classifier: AUC, log loss, calibration.

:class:`BinaryMetrics` takes logits batch by batch. Log loss, counts, positive rate and
calibration are running sums (float64), exact over everything seen. AUC needs every prediction:
they are kept on the CPU as float32 (12 bytes each with label and weight, so 10 million cost
120 MB) and sorted once in :meth:`BinaryMetrics.compute`, an exact AUC with ties counted half.
Past ``capacity`` predictions the store becomes a uniform reservoir sample of that size
(Vitter's algorithm R, seeded), so memory stays bounded and the AUC becomes an estimate whose
standard error shrinks with the positives kept (about 1e-3 with 100k of them); ``auc_count`` in
the result says how many predictions it was computed on. ``update`` copies each batch to the
CPU, which waits for the GPU: call it on evaluation batches, or accept one sync per step.

Rows of a channel labelled ``immediate`` hold every impression once as a negative and each click
again as a positive, so their positive rate is P/(N+P), not the click rate: such rows are
counted apart (``update(..., immediate=True)``) and the result adds ``positive_rate_corrected``
(positives over impressions, P/(rows - P)) and ``calibration_corrected`` (the predictions summed
over the impressions, i.e. the label-0 rows, over P). :class:`Scores` adds, from a column of
true probabilities, the oracle's AUC and log loss over the same rows and labels.

Their AUC is taken over impressions when each row's label key is given (``keys``): an
impression's first row (label 0) is its prediction, made before its click was known, and its
label is whether a positive row with the same key was seen by the time the AUC is computed;
repeated positives are not predictions of their own. Over rows instead, each click would count
twice, once as a fake negative scored early and once as a positive scored later by a model that
has trained since, which ranks a later model's scores against an earlier one's.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as dist

from flow.errors import ConfigError
from trainers.data import NO_KEY

__all__ = ["BinaryMetrics", "Scores", "binary_auc"]

log = logging.getLogger(__name__)


def binary_auc(
    scores: npt.ArrayLike, labels: npt.ArrayLike, weights: npt.ArrayLike | None = None
) -> float:
    """The area under the ROC curve: the weighted probability that a positive outranks a
    negative, a tie counting one half (Mann-Whitney U with average ranks).

    A label ``y`` in [0, 1] counts as weight ``w·y`` positive and ``w·(1-y)`` negative, which for
    0/1 labels is the usual definition. NaN when there are no positives or no negatives.
    """
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels, dtype=np.float64).ravel()
    w = np.ones_like(s) if weights is None else np.asarray(weights, np.float64).ravel()
    if not s.size:
        return math.nan
    order = np.argsort(s, kind="stable")
    sorted_scores = s[order]
    positive = (w * y)[order]
    negative = (w * (1.0 - y))[order]
    starts = np.concatenate([[0], np.flatnonzero(np.diff(sorted_scores)) + 1])
    positive_tied = np.add.reduceat(positive, starts)
    negative_tied = np.add.reduceat(negative, starts)
    total_positive, total_negative = positive_tied.sum(), negative_tied.sum()
    if total_positive <= 0 or total_negative <= 0:
        return math.nan
    negative_below = np.cumsum(negative_tied) - negative_tied
    wins = positive_tied * (negative_below + 0.5 * negative_tied)
    return float(wins.sum() / (total_positive * total_negative))


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else math.nan


def _numpy(values: torch.Tensor | np.ndarray) -> npt.NDArray[np.float32]:
    if isinstance(values, np.ndarray):
        return values.astype(np.float32, copy=False).ravel()
    array: npt.NDArray[np.float32] = values.detach().float().flatten().cpu().numpy()
    return array


class BinaryMetrics:
    """AUC, log loss, positive rate and calibration of logits, accumulated across batches.

    ``compute()`` returns ``auc``, ``logloss`` (weighted mean of the binary cross-entropy),
    ``count`` (predictions seen), ``positive_rate`` (weighted mean label), ``calibration``
    (mean predicted probability / mean label; 1 is calibrated) and ``auc_count`` (predictions
    the AUC used: ``count`` unless more than ``capacity`` arrived); with rows of an immediate
    channel among them, ``positive_rate_corrected`` and ``calibration_corrected`` (see the
    module's docstring). With ``distributed=True`` and a process group initialised, every rank
    gets the metrics of all ranks' predictions.

    A metric with nothing to measure is NaN rather than an error: AUC when every label is the
    same (there is no positive-negative pair to rank), calibration without positives, everything
    before the first update. The AUC case is logged, since an evaluation set of one class is
    usually a bug upstream.
    """

    def __init__(self, capacity: int = 10_000_000, seed: int = 0) -> None:
        if capacity < 1:
            raise ConfigError(f"BinaryMetrics capacity is {capacity}; give 1 or more")
        self.capacity = capacity
        self.seed = seed
        self.reset()

    def reset(self) -> None:
        """Forget everything seen."""
        self._rng = np.random.default_rng(self.seed)
        self._chunks: list[npt.NDArray[np.float32]] = []
        self._key_chunks: list[npt.NDArray[np.int64]] = []
        self._store: npt.NDArray[np.float32] | None = None  # [3, capacity] once sampling
        self._store_keys: npt.NDArray[np.int64] | None = None  # [capacity], NO_KEY: unkeyed
        self._count = 0
        self._offered = 0  # predictions offered to the store (repeated positives are not)
        self._positives: list[npt.NDArray[np.int64]] = []  # keys of repeated positives
        self._positive_count = 0
        # weight, weight·label, weight·probability, weight·loss; of immediate rows: weight,
        # weight·label (the positives that repeat an impression), and weight·probability over
        # the impressions (every row but those repeated positives)
        self._sums = np.zeros(7, dtype=np.float64)

    @property
    def count(self) -> int:
        return self._count

    def update(
        self,
        logits: torch.Tensor | np.ndarray,
        labels: torch.Tensor | np.ndarray,
        weights: torch.Tensor | np.ndarray | None = None,
        *,
        immediate: bool = False,
        keys: np.ndarray | None = None,
    ) -> None:
        """Add a batch: ``logits``, ``labels`` in [0, 1] and optional ``weights``, same length;
        ``immediate``: the rows come from a channel labelled ``immediate``; ``keys``: their
        label keys as int64 hashes (``NO_KEY`` where unknown), which makes their AUC one over
        impressions (see the module's docstring)."""
        x = _numpy(logits)
        y = _numpy(labels)
        w = np.ones_like(x) if weights is None else _numpy(weights)
        if not (x.shape == y.shape == w.shape) or (keys is not None and keys.shape != x.shape):
            raise ValueError(
                f"logits, labels, weights and keys have {x.size}, {y.size}, {w.size} and "
                f"{x.size if keys is None else keys.size} values; give one of each per prediction"
            )
        x64, y64, w64 = x.astype(np.float64), y.astype(np.float64), w.astype(np.float64)
        # -log p(y) from the logit, stable for large |x|: softplus(x) - y x
        loss = np.logaddexp(0.0, x64) - y64 * x64
        probability = 0.5 * (1.0 + np.tanh(0.5 * x64))
        repeated = y64 if immediate else np.zeros_like(y64)
        self._sums += [
            w64.sum(),
            (w64 * y64).sum(),
            (w64 * probability).sum(),
            (w64 * loss).sum(),
            w64.sum() if immediate else 0.0,
            (w64 * repeated).sum(),
            (w64 * probability * (1.0 - repeated)).sum(),
        ]
        self._count += x.size
        rows = np.stack([x, y, w])
        if not immediate or keys is None:
            self._keep(rows, np.full(x.size, NO_KEY, dtype=np.int64))
            return
        keyed = keys != NO_KEY
        repeated = keyed & (y > 0)  # a click's second row: its impression was the first
        self._keep(rows[:, ~repeated], keys[~repeated])
        self._positives.append(keys[repeated])
        self._positive_count += int(repeated.sum())
        if self._store is not None and self._positive_count > 2 * self.capacity:
            self._forget_positives()

    def _keep(self, rows: npt.NDArray[np.float32], keys: npt.NDArray[np.int64]) -> None:
        n = rows.shape[1]
        stored = min(self._offered, self.capacity)
        take = min(n, self.capacity - stored)
        if take:
            self._chunks.append(rows[:, :take])
            self._key_chunks.append(keys[:take])
        if take < n:
            self._sample(rows[:, take:], keys[take:], self._offered + take)
        self._offered += n

    def _sample(
        self, rows: npt.NDArray[np.float32], keys: npt.NDArray[np.int64], offered: int
    ) -> None:
        if self._store is None or self._store_keys is None:
            self._store, self._store_keys = self._stored()
            self._chunks, self._key_chunks = [], []
        # Algorithm R, vectorised: the item seen t-th (0-based) replaces a random slot with
        # probability capacity / (t + 1); where two land on one slot, the later one wins.
        seen = offered + np.arange(rows.shape[1])
        accepted = np.flatnonzero(self._rng.random(rows.shape[1]) < self.capacity / (seen + 1))
        slots = self._rng.integers(0, self.capacity, size=accepted.size)
        last_slots, last = np.unique(slots[::-1], return_index=True)
        chosen = accepted[::-1][last]
        self._store[:, last_slots] = rows[:, chosen]
        self._store_keys[last_slots] = keys[chosen]

    def _forget_positives(self) -> None:
        """Keep the positive keys that can still label something: those of impressions in the
        store, and the latest ``capacity`` (an impression may come after its click's row when
        both are in one shuffle window)."""
        if self._store_keys is None:
            return
        every = np.concatenate(self._positives)
        kept = np.union1d(every[np.isin(every, self._store_keys)], every[-self.capacity :]).astype(
            np.int64
        )
        self._positives, self._positive_count = [kept], kept.size

    def _stored(self) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        if self._store is not None and self._store_keys is not None:
            return self._store, self._store_keys
        if not self._chunks:
            return np.zeros((3, 0), dtype=np.float32), np.zeros(0, dtype=np.int64)
        return np.concatenate(self._chunks, axis=1), np.concatenate(self._key_chunks)

    def _positive_keys(self) -> npt.NDArray[np.int64]:
        if not self._positives:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate(self._positives)

    def compute(self, distributed: bool = False) -> dict[str, float]:
        """The metrics so far; ``distributed`` gathers every rank's (a collective: call it on
        all ranks)."""
        sums = self._sums
        count = float(self._count)
        stored, keys = self._stored()
        positives = self._positive_keys()
        # Each kept prediction stands for offered/kept of those offered (1 until sampling).
        parts = [_Kept(stored, keys, self._offered / max(stored.shape[1], 1))]
        if distributed and dist.is_available() and dist.is_initialized():
            sums, count, parts, positives = _gather(sums, count, parts[0], positives)
        weight, weighted_labels, weighted_probabilities, weighted_loss = sums[:4].tolist()
        immediate, repeated, over_impressions = sums[4:].tolist()
        scores = np.concatenate([kept.rows[0] for kept in parts])
        labels = np.concatenate([kept.rows[1] for kept in parts])
        weights = np.concatenate([kept.rows[2].astype(np.float64) * kept.factor for kept in parts])
        every_key = np.concatenate([kept.keys for kept in parts])
        keyed = every_key != NO_KEY
        if keyed.any():  # impressions: clicked if a positive row with their key was seen
            labels = labels.copy()
            labels[keyed] = np.isin(every_key[keyed], positives)
        auc = binary_auc(scores, labels, weights)
        if math.isnan(auc) and count:
            log.warning(
                "AUC is undefined (NaN): the %d predictions have %s",
                count,
                "only positive labels" if weighted_labels else "only negative labels",
            )
        found = {
            "auc": auc,
            "logloss": _ratio(weighted_loss, weight),
            "count": count,
            "positive_rate": _ratio(weighted_labels, weight),
            "calibration": _ratio(weighted_probabilities, weighted_labels),
            "auc_count": float(scores.size),
        }
        if keyed.any():
            found["auc_impressions"] = float(np.count_nonzero(keyed))
        if immediate:
            found["positive_rate_corrected"] = _ratio(weighted_labels, weight - repeated)
            found["calibration_corrected"] = _ratio(over_impressions, weighted_labels)
        return found


@dataclass
class _Kept:
    """One rank's kept predictions: ``rows`` (logit, label, weight), their keys, and how many
    offered predictions each stands for."""

    rows: npt.NDArray[np.float32]
    keys: npt.NDArray[np.int64]
    factor: float


def _gather(
    sums: npt.NDArray[np.float64],
    count: float,
    kept: _Kept,
    positives: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.float64], float, list[_Kept], npt.NDArray[np.int64]]:
    """Every rank's sums (added), kept predictions (with each rank's sampling factor) and
    positive keys: an impression and its click's row may be on different ranks."""
    # NCCL moves only CUDA tensors; gloo only CPU ones.
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )
    size = kept.rows.shape[1]
    offered = kept.factor * max(size, 1)
    totals = torch.tensor(
        [*sums, count, offered, size, positives.size], dtype=torch.float64, device=device
    )
    world = dist.get_world_size()
    per_rank = [torch.empty_like(totals) for _ in range(world)]
    dist.all_gather(per_rank, totals)
    sizes = [int(t[-2].item()) for t in per_rank]
    offers = [float(t[-3].item()) for t in per_rank]
    positive_sizes = [int(t[-1].item()) for t in per_rank]

    def everyone(values: np.ndarray, longest: int) -> list[np.ndarray]:
        shape = (*values.shape[:-1], max(longest, 1))  # gloo gathers no empty tensors
        padded = torch.zeros(shape, dtype=torch.from_numpy(values).dtype)
        padded[..., : values.shape[-1]] = torch.from_numpy(values)
        padded = padded.to(device)
        gathered = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(gathered, padded)
        return [g.cpu().numpy() for g in gathered]

    rows = everyone(kept.rows, max(sizes))
    keys = everyone(kept.keys, max(sizes))
    positive_keys = everyone(positives, max(positive_sizes))
    total = torch.stack(per_rank).sum(dim=0).cpu().numpy()
    parts = [
        _Kept(r[:, :n], k[:n], offer / max(n, 1))
        for r, k, n, offer in zip(rows, keys, sizes, offers, strict=True)
    ]
    every_positive = np.concatenate(
        [p[:n] for p, n in zip(positive_keys, positive_sizes, strict=True)]
    )
    return total[: len(sums)], float(total[len(sums)]), parts, every_positive


class Scores:
    """A model's metrics and, given true probabilities (an oracle column), the oracle's.

    The oracle is scored like a model whose logit is ``logit(p)``, over exactly the rows and
    labels the model is scored on that have a probability; rows without one (null, or a batch
    without the column) are left out of the oracle's figures and counted. ``compute()`` gives
    the model's metrics and, with an oracle, ``oracle_auc``, ``oracle_logloss``,
    ``oracle_count`` and ``oracle_missing``.
    """

    def __init__(self, capacity: int = 1_000_000, *, oracle: bool = False, seed: int = 0) -> None:
        self.model = BinaryMetrics(capacity=capacity, seed=seed)
        self.oracle = BinaryMetrics(capacity=capacity, seed=seed + 1) if oracle else None

    @property
    def count(self) -> int:
        return self.model.count

    def reset(self) -> None:
        self.model.reset()
        if self.oracle is not None:
            self.oracle.reset()

    def update(
        self,
        logits: torch.Tensor | np.ndarray,
        labels: torch.Tensor | np.ndarray,
        weights: torch.Tensor | np.ndarray | None = None,
        *,
        immediate: bool = False,
        oracle: np.ndarray | None = None,
        keys: np.ndarray | None = None,
    ) -> None:
        """Add a batch (see :meth:`BinaryMetrics.update`); ``oracle``: each row's true
        probability, NaN where unknown (None: unknown for every row)."""
        self.model.update(logits, labels, weights, immediate=immediate, keys=keys)
        if self.oracle is None or oracle is None:
            return
        known = np.isfinite(oracle)
        if not known.any():
            return
        y = _numpy(labels)[known]
        w = None if weights is None else _numpy(weights)[known]
        p = np.clip(oracle[known], 1e-7, 1 - 1e-7)
        self.oracle.update(
            np.log(p) - np.log1p(-p),
            y,
            w,
            immediate=immediate,
            keys=None if keys is None else keys[known],
        )

    def compute(self, distributed: bool = False) -> dict[str, float]:
        """The metrics so far (a collective with ``distributed``: call it on all ranks)."""
        found = self.model.compute(distributed=distributed)
        if self.oracle is None:
            return found
        oracle = self.oracle.compute(distributed=distributed)
        found["oracle_count"] = oracle["count"]
        found["oracle_missing"] = found["count"] - oracle["count"]
        if oracle["count"]:
            found["oracle_auc"] = oracle["auc"]
            found["oracle_logloss"] = oracle["logloss"]
            # The true click rate per impression: the oracle's mean probability (over the
            # impressions: the first rows, with immediate labels), calibration x positive rate.
            corrected = "calibration_corrected" in oracle
            calibration = oracle["calibration_corrected" if corrected else "calibration"]
            rate = oracle["positive_rate_corrected" if corrected else "positive_rate"]
            if math.isfinite(calibration) and math.isfinite(rate):
                found["oracle_rate"] = calibration * rate
        return found
