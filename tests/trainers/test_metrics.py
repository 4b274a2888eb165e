"""Streaming metrics: exact AUC with ties and weights, log loss, calibration, across ranks."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.multiprocessing.spawn import spawn

from trainers.metrics import BinaryMetrics, Scores, binary_auc


def auc_by_pairs(scores, labels, weights) -> float:
    """Every positive-negative pair: 1 if ranked right, 1/2 if tied, weighted by both weights."""
    wins = total = 0.0
    for i, j in itertools.product(range(len(scores)), repeat=2):
        if labels[i] == 1 and labels[j] == 0:
            pair = weights[i] * weights[j]
            total += pair
            wins += pair * (1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0)
    return wins / total if total else math.nan


@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(-3, 3), st.integers(0, 1), st.sampled_from([0.5, 1.0, 2.0])),
        min_size=1,
        max_size=30,
    )
)
def test_auc_equals_the_pairwise_count_with_ties_and_weights(rows):
    scores, labels, weights = (np.array(c, dtype=np.float64) for c in zip(*rows, strict=True))
    expected = auc_by_pairs(scores, labels, weights)
    if math.isnan(expected):
        assert math.isnan(binary_auc(scores, labels, weights))
    else:
        assert binary_auc(scores, labels, weights) == pytest.approx(expected, abs=1e-12)


def test_auc_of_known_cases():
    assert binary_auc([0.1, 0.9], [0, 1]) == 1.0
    assert binary_auc([0.9, 0.1], [0, 1]) == 0.0
    assert binary_auc([0.5, 0.5, 0.5], [0, 1, 1]) == 0.5
    assert math.isnan(binary_auc([], []))
    assert math.isnan(binary_auc([0.1, 0.2], [1, 1]))


def random_predictions(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (n,), generator=g).float()
    # Rounded logits: plenty of ties.
    logits = torch.round(2 * torch.randn(n, generator=g) + labels)
    weights = torch.rand(n, generator=g) + 0.5
    return logits, labels, weights


def test_streamed_batches_give_the_metrics_of_the_whole():
    logits, labels, weights = random_predictions(1000)
    metrics = BinaryMetrics()
    for start in range(0, 1000, 128):
        chunk = slice(start, start + 128)
        metrics.update(logits[chunk], labels[chunk], weights[chunk])
    result = metrics.compute()

    losses = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    probabilities = torch.sigmoid(logits)
    assert result["count"] == 1000
    assert result["auc_count"] == 1000
    assert result["auc"] == pytest.approx(
        binary_auc(logits.numpy(), labels.numpy(), weights.numpy())
    )
    assert result["logloss"] == pytest.approx(float((losses * weights).sum() / weights.sum()))
    assert result["positive_rate"] == pytest.approx(float((labels * weights).sum() / weights.sum()))
    assert result["calibration"] == pytest.approx(
        float((probabilities * weights).sum() / (labels * weights).sum())
    )


def test_unweighted_log_loss_is_torchs_bce():
    logits, labels, _ = random_predictions(500, seed=3)
    metrics = BinaryMetrics()
    metrics.update(logits.double() * 10, labels)  # large logits: the loss must stay finite
    expected = F.binary_cross_entropy_with_logits(logits.double() * 10, labels.double())
    assert metrics.compute()["logloss"] == pytest.approx(float(expected))


def test_weights_count_as_repeated_rows():
    logits = torch.tensor([2.0, -1.0, 0.5, 0.0])
    labels = torch.tensor([1.0, 0.0, 0.0, 1.0])
    weighted = BinaryMetrics()
    weighted.update(logits, labels, torch.tensor([3.0, 1.0, 2.0, 1.0]))
    repeats = torch.tensor([3, 1, 2, 1])
    repeated = BinaryMetrics()
    repeated.update(logits.repeat_interleave(repeats), labels.repeat_interleave(repeats))
    a, b = weighted.compute(), repeated.compute()
    for key in ("auc", "logloss", "positive_rate", "calibration"):
        assert a[key] == pytest.approx(b[key]), key


def test_constant_labels_give_nan_auc_not_an_error(caplog):
    metrics = BinaryMetrics()
    metrics.update(torch.randn(10), torch.ones(10))
    result = metrics.compute()
    assert math.isnan(result["auc"])
    assert result["positive_rate"] == 1.0
    assert "only positive labels" in caplog.text


def test_nothing_seen_is_nan_and_reset_forgets():
    metrics = BinaryMetrics()
    assert math.isnan(metrics.compute()["auc"])
    metrics.update(torch.tensor([1.0, -1.0]), torch.tensor([1.0, 0.0]))
    metrics.reset()
    result = metrics.compute()
    assert result["count"] == 0
    assert math.isnan(result["logloss"])


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="one of each"):
        BinaryMetrics().update(torch.zeros(3), torch.zeros(4))


def test_past_capacity_memory_stays_bounded_and_auc_is_estimated():
    logits, labels, weights = random_predictions(20_000, seed=5)
    metrics = BinaryMetrics(capacity=5_000)
    for start in range(0, 20_000, 1_500):
        chunk = slice(start, start + 1_500)
        metrics.update(logits[chunk], labels[chunk], weights[chunk])
    result = metrics.compute()
    exact = binary_auc(logits.numpy(), labels.numpy(), weights.numpy())
    assert result["count"] == 20_000
    assert result["auc_count"] == 5_000
    assert result["auc"] == pytest.approx(exact, abs=0.02)
    losses = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    assert result["logloss"] == pytest.approx(float((losses * weights).sum() / weights.sum()))


def test_immediate_rows_are_counted_per_impression():
    # 10 impressions, each once as a negative; 3 of them clicked, emitted again as positives.
    impressions = torch.linspace(-2, 2, 10)
    clicked = torch.tensor([1, 4, 9])
    logits = torch.cat([impressions, impressions[clicked]])
    labels = torch.cat([torch.zeros(10), torch.ones(3)])
    metrics = BinaryMetrics()
    metrics.update(logits, labels, immediate=True)
    result = metrics.compute()
    assert result["positive_rate"] == pytest.approx(3 / 13)
    assert result["positive_rate_corrected"] == pytest.approx(3 / 10)
    # Predictions summed over the impressions (the label-0 rows), over the clicks.
    assert result["calibration_corrected"] == pytest.approx(
        float(torch.sigmoid(impressions).sum() / 3)
    )
    # Rows labelled by window beside them count as they are.
    metrics.update(torch.tensor([0.0, 0.0]), torch.tensor([1.0, 0.0]))
    mixed = metrics.compute()
    assert mixed["positive_rate_corrected"] == pytest.approx(4 / 12)
    assert mixed["calibration_corrected"] == pytest.approx(
        float(torch.sigmoid(impressions).sum() + 1.0) / 4
    )


def immediate_rows(
    impressions: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """An immediate channel's rows in a shuffled order: each impression once as a negative
    scored by an early model, each click's row again as a positive scored by a later one; and
    the impressions' own (logit, clicked) to compare with."""
    rng = np.random.default_rng(seed)
    first = np.round(rng.normal(size=impressions), 1)  # ties too
    clicked = rng.random(impressions) < 1 / (1 + np.exp(-first))
    keys = rng.permutation(np.arange(impressions, dtype=np.int64) * 7919 + 13)
    later = first[clicked] + rng.normal(2.0, 1.0, size=int(clicked.sum()))  # the model learnt
    logits = np.concatenate([first, later])
    labels = np.concatenate([np.zeros(impressions), np.ones(int(clicked.sum()))])
    row_keys = np.concatenate([keys, keys[clicked]])
    order = rng.permutation(len(logits))
    return logits[order], labels[order], row_keys[order], first, clicked.astype(np.float64)


@settings(max_examples=40, deadline=None)
@given(
    impressions=st.integers(2, 300),
    seed=st.integers(0, 2**16),
    batch=st.integers(1, 64),
    capacity=st.sampled_from([10_000, 10**7]),
)
def test_immediate_rows_with_keys_are_scored_once_per_impression(
    impressions: int, seed: int, batch: int, capacity: int
) -> None:
    logits, labels, keys, first, clicked = immediate_rows(impressions, seed)
    metrics = BinaryMetrics(capacity=capacity)
    for start in range(0, len(logits), batch):
        part = slice(start, start + batch)
        metrics.update(logits[part], labels[part], immediate=True, keys=keys[part])
    result = metrics.compute()
    # The AUC of each impression's first prediction against whether it was clicked, in
    # whatever order its rows came (a click's row may come before its impression's).
    expected = binary_auc(first, clicked)
    if math.isnan(expected):
        assert math.isnan(result["auc"])
    else:
        assert result["auc"] == pytest.approx(expected, abs=1e-6)
    assert result["auc_impressions"] == impressions
    assert result["count"] == len(logits)
    assert result["positive_rate_corrected"] == pytest.approx(clicked.mean())


def test_over_rows_a_click_scored_later_would_count_twice() -> None:
    # What the keys fix: the row-level AUC ranks the later model's positives against the
    # early fake negatives, and beats what any impression-level prediction achieved.
    logits, labels, keys, first, clicked = immediate_rows(5_000, seed=1)
    by_rows, by_impressions = BinaryMetrics(), BinaryMetrics()
    by_rows.update(logits, labels, immediate=True)
    by_impressions.update(logits, labels, immediate=True, keys=keys)
    assert by_impressions.compute()["auc"] == pytest.approx(binary_auc(first, clicked))
    assert by_rows.compute()["auc"] > binary_auc(first, clicked) + 0.05
    assert "auc_impressions" not in by_rows.compute()


def test_impressions_sampled_past_capacity_keep_their_clicks() -> None:
    logits, labels, keys, first, clicked = immediate_rows(40_000, seed=2)
    # As a stream gives them: a click's row after its impression's (here at once after it).
    impression = labels == 0
    position = {k: i for i, k in enumerate(keys[impression].tolist())}
    order = np.argsort(
        [position[k] + (0.5 if y else 0.0) for k, y in zip(keys.tolist(), labels, strict=True)]
    )
    logits, labels, keys = logits[order], labels[order], keys[order]
    metrics = BinaryMetrics(capacity=4_000)
    for start in range(0, len(logits), 1_000):
        part = slice(start, start + 1_000)
        metrics.update(logits[part], labels[part], immediate=True, keys=keys[part])
    result = metrics.compute()
    assert result["auc_count"] == 4_000
    assert result["auc"] == pytest.approx(binary_auc(first, clicked), abs=0.02)
    # The positive keys kept stay bounded: those of stored impressions and the latest ones.
    assert metrics._positive_count <= 3 * 4_000


def test_a_row_without_a_key_is_scored_as_a_row() -> None:
    from trainers.data import NO_KEY

    metrics = BinaryMetrics()
    # Impression 5 clicked; an unkeyed positive row and an unkeyed negative.
    keys = np.array([5, 6, 5, NO_KEY, NO_KEY], dtype=np.int64)
    metrics.update(
        np.array([2.0, 0.0, -3.0, 1.0, -1.0]),
        np.array([0.0, 0.0, 1.0, 1.0, 0.0]),
        immediate=True,
        keys=keys,
    )
    result = metrics.compute()
    # Scored: impression 5 (2.0, clicked), 6 (0.0, not), and the two unkeyed rows as they are.
    assert result["auc_count"] == 4
    assert result["auc"] == binary_auc([2.0, 0.0, 1.0, -1.0], [1, 0, 1, 0])
    assert result["auc_impressions"] == 2


def test_the_oracle_is_scored_on_the_same_impressions() -> None:
    logits, labels, keys, first, clicked = immediate_rows(2_000, seed=4)
    # The oracle knows each impression's probability: here the early model's, on both rows.
    first_by_key = dict(zip(keys[labels == 0].tolist(), logits[labels == 0].tolist(), strict=True))
    truth = 1 / (1 + np.exp(-np.array([first_by_key[k] for k in keys.tolist()])))
    scores = Scores(oracle=True)
    scores.update(logits, labels, immediate=True, oracle=truth, keys=keys)
    result = scores.compute()
    assert result["oracle_auc"] == pytest.approx(binary_auc(first, clicked), abs=1e-6)
    assert result["auc"] == pytest.approx(result["oracle_auc"], abs=1e-6)


def test_rows_labelled_by_window_have_no_corrected_figures():
    metrics = BinaryMetrics()
    metrics.update(torch.tensor([1.0, -1.0]), torch.tensor([1.0, 0.0]))
    assert "positive_rate_corrected" not in metrics.compute()


def test_the_oracle_is_scored_on_the_same_rows_and_labels_without_its_nulls():
    logits, labels, weights = random_predictions(400, seed=7)
    truth = torch.sigmoid(logits / 2).double().numpy()
    truth[::10] = np.nan  # 40 rows without a true probability
    scores = Scores(oracle=True)
    for chunk in (slice(0, 150), slice(150, 400)):
        scores.update(logits[chunk], labels[chunk], weights[chunk], oracle=truth[chunk])
    scores.update(torch.zeros(5), torch.ones(5))  # a batch without the column
    result = scores.compute()
    known = ~np.isnan(truth)
    assert result["count"] == 405
    assert result["oracle_count"] == 360
    assert result["oracle_missing"] == 45
    assert result["oracle_auc"] == pytest.approx(
        binary_auc(truth[known], labels.numpy()[known], weights.numpy()[known]), abs=1e-6
    )
    p, y, w = truth[known], labels.double().numpy()[known], weights.double().numpy()[known]
    loss = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    assert result["oracle_logloss"] == pytest.approx(float((w * loss).sum() / w.sum()), rel=1e-5)
    # The true rate: the oracle's mean probability over its rows.
    assert result["oracle_rate"] == pytest.approx(float((w * p).sum() / w.sum()), rel=1e-5)
    assert "oracle_auc" not in Scores(oracle=False).compute()


def test_with_immediate_labels_the_true_rate_is_over_impressions_not_rows():
    # Two impressions, one clicked: rows (negative, negative, its positive again).
    scores = Scores(oracle=True)
    truth = np.array([0.2, 0.6, 0.6])
    scores.update(torch.zeros(3), torch.tensor([0.0, 0.0, 1.0]), immediate=True, oracle=truth)
    assert scores.compute()["oracle_rate"] == pytest.approx(0.4)  # (0.2 + 0.6) / 2


def _rank(rank: int, world: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        logits, labels, weights = random_predictions(3000)
        # Unequal shares, and rank 1 has more than its capacity: it keeps a sample.
        mine = torch.arange(3000)[:1000] if rank == 0 else torch.arange(3000)[1000:]
        metrics = BinaryMetrics(capacity=1000 if rank == 0 else 1500)
        metrics.update(logits[mine], labels[mine], weights[mine])
        torch.save(metrics.compute(distributed=True), f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_distributed_compute_reports_the_global_metrics_on_every_rank(tmp_path: Path):
    world = 2
    out = str(tmp_path / "result")
    spawn(_rank, args=(world, str(tmp_path / "store"), out), nprocs=world)  # type: ignore[no-untyped-call]
    results = [torch.load(f"{out}.{rank}") for rank in range(world)]
    logits, labels, weights = random_predictions(3000)
    losses = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    assert results[0] == results[1]
    assert results[0]["count"] == 3000
    assert results[0]["auc_count"] == 2500
    assert results[0]["logloss"] == pytest.approx(float((losses * weights).sum() / weights.sum()))
    exact = binary_auc(logits.numpy(), labels.numpy(), weights.numpy())
    assert results[0]["auc"] == pytest.approx(exact, abs=0.02)


def _rank_keyed(rank: int, world: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        logits, labels, keys, _, _ = immediate_rows(600, seed=9)
        # Rows dealt to ranks apart from their keys: a click's row is often on the other rank.
        mine = np.arange(len(logits)) % world == rank
        scores = Scores(oracle=True)
        truth = np.full(len(logits), 0.5)
        truth[: len(logits) // 2] = np.linspace(0.01, 0.99, len(logits) // 2)
        scores.update(
            logits[mine], labels[mine], immediate=True, oracle=truth[mine], keys=keys[mine]
        )
        torch.save(scores.compute(distributed=True), f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_distributed_impressions_find_their_clicks_on_other_ranks(tmp_path: Path) -> None:
    world = 2
    out = str(tmp_path / "result")
    spawn(_rank_keyed, args=(world, str(tmp_path / "store"), out), nprocs=world)  # type: ignore[no-untyped-call]
    results = [torch.load(f"{out}.{rank}") for rank in range(world)]
    logits, labels, keys, first, clicked = immediate_rows(600, seed=9)
    alone = BinaryMetrics()
    alone.update(logits, labels, immediate=True, keys=keys)
    assert results[0] == results[1]
    assert results[0]["auc"] == pytest.approx(binary_auc(first, clicked), abs=1e-6)
    assert results[0]["auc_impressions"] == 600
    assert results[0]["auc"] == pytest.approx(alone.compute()["auc"], abs=1e-6)
