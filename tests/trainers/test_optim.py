"""Optimizers over a CTR model: two groups, one checkpoint, and CowClip's per-row clipping."""

from __future__ import annotations

import io
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from flow.errors import ConfigError
from flow.pipeline.state import Layout
from flow.training import OptimConfig
from tests.trainers.test_models import LAYOUT, model, random_batch
from trainers.models import CTRModel
from trainers.optim import CombinedOptimizer, CowClip, build_optimizer, cowclip_


def train_step(
    m: CTRModel,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, torch.Tensor],
    clip: CowClip | None = None,
) -> None:
    loss = F.binary_cross_entropy_with_logits(m(batch), batch["label"])
    optimizer.zero_grad()
    loss.backward()  # type: ignore[no-untyped-call]
    if clip is not None:
        clip.apply(m, batch)
    optimizer.step()


def group_params(optimizer: torch.optim.Optimizer) -> dict[str, tuple[set[int], float]]:
    return {g["name"]: ({id(p) for p in g["params"]}, g["lr"]) for g in optimizer.param_groups}


@pytest.mark.parametrize(
    ("embedding", "dense", "kinds"),
    [
        ("adam", "adam", {"Adam"}),
        ("adagrad", "adam", {"Adagrad", "Adam"}),
        ("sgd", "adagrad", {"SGD", "Adagrad"}),
    ],
)
def test_tables_and_dense_layers_get_their_own_group_kind_and_rate(embedding, dense, kinds):
    m = model("deepfm")
    config = OptimConfig(embedding=embedding, dense=dense, lr=0.01, embedding_lr=0.1)
    optimizer = build_optimizer(m, config)
    assert isinstance(optimizer, torch.optim.Optimizer)
    groups = group_params(optimizer)
    assert groups == {
        "embedding": ({id(p) for p in m.embedding_parameters()}, 0.1),
        "dense": ({id(p) for p in m.dense_parameters()}, 0.01),
    }
    if len(kinds) == 1:
        assert type(optimizer).__name__ in kinds
    else:
        assert isinstance(optimizer, CombinedOptimizer)
        assert {type(o).__name__ for o in optimizer.parts.values()} == kinds
        assert type(optimizer.parts["embedding"]).__name__.lower() == embedding


def test_an_unset_embedding_lr_is_lr():
    config = OptimConfig(lr=0.05, embedding_lr=None)
    groups = group_params(build_optimizer(model("dlrm"), config))
    assert groups["embedding"][1] == groups["dense"][1] == 0.05


@pytest.mark.parametrize(("embedding", "dense"), [("adagrad", "adam"), ("adam", "adam")])
def test_a_checkpoint_round_trips_exactly(embedding, dense):
    config = OptimConfig(embedding=embedding, dense=dense, lr=0.01, weight_decay=1e-4)
    batches = [random_batch(LAYOUT, seed=s) for s in range(4)]
    m = model("dlrm")
    optimizer = build_optimizer(m, config)
    for batch in batches[:3]:
        train_step(m, optimizer, batch)
    saved = io.BytesIO()
    torch.save({"model": m.state_dict(), "optimizer": optimizer.state_dict()}, saved)

    saved.seek(0)
    checkpoint = torch.load(saved)
    resumed = model("dlrm")
    resumed.load_state_dict(checkpoint["model"])
    resumed_optimizer = build_optimizer(resumed, config)
    resumed_optimizer.load_state_dict(checkpoint["optimizer"])

    train_step(m, optimizer, batches[3])
    train_step(resumed, resumed_optimizer, batches[3])
    for (name, a), b in zip(m.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert group_params(resumed_optimizer).keys() == {"embedding", "dense"}


def test_a_scheduler_drives_both_parts_of_a_combined_optimizer():
    config = OptimConfig(embedding="adagrad", lr=1.0, embedding_lr=None)
    optimizer = build_optimizer(model("wide_deep"), config)
    assert isinstance(optimizer, CombinedOptimizer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    optimizer.step()
    scheduler.step()
    assert [g["lr"] for o in optimizer.parts.values() for g in o.param_groups] == [0.5, 0.5]


def test_loading_a_checkpoint_of_other_kinds_is_refused():
    m = model("deepfm")
    combined = build_optimizer(m, OptimConfig(embedding="adagrad"))
    single = build_optimizer(m, OptimConfig(embedding="adam"))
    bogus = {"embedding": combined.state_dict()["embedding"]}
    with pytest.raises(ConfigError, match="other optimizer kinds"):
        combined.load_state_dict(bogus)
    assert isinstance(single, torch.optim.Adam)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"embedding": "rmsprop"}, "OptimConfig.embedding is 'rmsprop'; choose one of adam, "),
        ({"dense": "lamb"}, "OptimConfig.dense"),
        ({"lr": 0.0}, "OptimConfig.lr"),
        ({"lr": math.nan}, "OptimConfig.lr"),
        ({"embedding_lr": -1.0}, "OptimConfig.embedding_lr"),
        ({"weight_decay": -0.1}, "OptimConfig.weight_decay"),
        ({"cowclip_ratio": 0.0}, "OptimConfig.cowclip_ratio"),
        ({"cowclip_min": 0.0}, "OptimConfig.cowclip_min"),
    ],
)
def test_config_names_the_field_to_change(fields, message):
    with pytest.raises(ConfigError, match=message):
        OptimConfig(**fields)


# -- CowClip --------------------------------------------------------------------------------


def clipped_by_hand(
    grad: torch.Tensor, weight: torch.Tensor, rows: list[int], ratio: float, min_norm: float
) -> torch.Tensor:
    """The paper's rule, one row at a time."""
    out = grad.clone()
    for row in set(rows):
        count = rows.count(row)
        threshold = count * max(ratio * weight[row].norm().item(), min_norm)
        norm = grad[row].norm().item()
        if norm > threshold:
            out[row] = grad[row] * (threshold / norm)
    return out


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.integers(0, 11), max_size=40),
    ratio=st.floats(0.05, 5.0),
    min_norm=st.floats(1e-6, 1.0),
    seed=st.integers(0, 2**16),
)
def test_cowclip_matches_the_rule_row_by_row(rows, ratio, min_norm, seed):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(12, 4, generator=g) * torch.rand(12, 1, generator=g)
    grad = torch.randn(12, 4, generator=g) * 3 * torch.rand(12, 1, generator=g)
    expected = clipped_by_hand(grad, weight, rows, ratio, min_norm)
    cowclip_(grad, weight, torch.tensor(rows, dtype=torch.long), ratio, min_norm)
    torch.testing.assert_close(grad, expected)


def test_cowclip_clips_only_rows_over_their_threshold():
    weight = torch.tensor([[3.0, 4.0], [0.0, 0.0], [0.6, 0.8], [1.0, 0.0]])  # norms 5, 0, 1, 1
    grad = torch.tensor([[6.0, 8.0], [1.0, 0.0], [3.0, 4.0], [9.0, 9.0]])  # norms 10, 1, 5, ~13
    rows = torch.tensor([0, 1, 2, 2, 2])  # row 3 unused: left as it is
    cowclip_(grad, weight, rows, ratio=1.0, min_norm=0.5)
    expected = torch.tensor([[3.0, 4.0], [0.5, 0.0], [1.8, 2.4], [9.0, 9.0]])
    torch.testing.assert_close(grad, expected)


def test_cowclip_on_a_model_counts_each_features_ids_apart():
    layout = Layout((), (("a", 5), ("b", 5)), (("history", 5, 3),))
    m = model("wide_deep", layout)
    batch = {
        "sparse": torch.tensor([[1, 1], [1, 2]]),
        "seq_history": torch.tensor([[1, 0, 0], [0, 0, 0]]),
        "label": torch.tensor([1.0, 0.0]),
    }
    loss = F.binary_cross_entropy_with_logits(m(batch), batch["label"])
    loss.backward()  # type: ignore[no-untyped-call]
    expected = {}
    for table in m.embedding_tables():
        assert table.weight.grad is not None
        # Feature k's id i is row offsets[k] + i: a's 1 twice, b's 1 and 2 once, history's 1 once.
        a, b, history = table.offsets
        rows = [a + 1, a + 1, b + 1, b + 2, history + 1]
        expected[table] = clipped_by_hand(
            table.weight.grad, table.weight.detach(), rows, 0.01, 1e-4
        )
        assert not torch.equal(expected[table], table.weight.grad), "nothing would be clipped"
    CowClip(ratio=0.01, min_norm=1e-4).apply(m, batch)
    for table, clipped in expected.items():
        torch.testing.assert_close(table.weight.grad, clipped)


def test_with_sgd_cowclip_bounds_each_rows_step_by_its_threshold():
    layout = Layout(("x",), (("item", 50),), ())
    m = model("deepfm", layout)
    ids = torch.arange(0, 40, 5)  # each id once: cnt = 1
    batch = {"dense": torch.randn(8, 1), "sparse": ids.unsqueeze(1), "label": torch.ones(8)}
    config = OptimConfig(
        embedding="sgd", dense="sgd", lr=1.0, embedding_lr=None, cowclip=True, cowclip_ratio=0.5
    )
    clip = CowClip.from_config(config)
    assert clip is not None
    optimizer = build_optimizer(m, config)
    before = [p.detach().clone() for p in m.embedding_parameters()]
    # A loss scaled far up: every used row's gradient is over its threshold.
    loss = 1e4 * F.binary_cross_entropy_with_logits(m(batch), batch["label"])
    loss.backward()  # type: ignore[no-untyped-call]
    clip.apply(m, batch)
    optimizer.step()
    for old, new in zip(before, m.embedding_parameters(), strict=True):
        step = (new.detach() - old).norm(dim=1)
        bound = (0.5 * old.norm(dim=1)).clamp(min=config.cowclip_min)
        torch.testing.assert_close(step[ids], bound[ids])
        assert not step[[i for i in range(50) if i not in ids]].any()


def test_cowclip_is_off_unless_configured():
    assert CowClip.from_config(OptimConfig()) is None
    assert CowClip.from_config(OptimConfig(cowclip=True)) == CowClip(1.0, 1e-5)


def test_combined_optimizer_refuses_to_be_empty():
    with pytest.raises(ConfigError):
        CombinedOptimizer({})


def test_the_cowclip_scaling_rule_keeps_the_embedding_rate_and_scales_the_rest():
    base = OptimConfig(lr=1e-3, embedding_lr=2e-4, weight_decay=1e-5)
    big = base.scaled_for(32)
    assert big.cowclip
    assert big.embedding_lr == 2e-4
    assert big.lr == pytest.approx(1e-3 * math.sqrt(32))
    assert big.embedding_weight_decay == pytest.approx(32e-5)
    assert big.weight_decay == 1e-5  # the dense layers' penalty is not the rule's
    groups = {g["name"]: g for g in build_optimizer(model("deepfm"), big).param_groups}
    assert groups["embedding"]["weight_decay"] == pytest.approx(32e-5)
    assert groups["dense"]["weight_decay"] == 1e-5
    unset = OptimConfig(lr=0.1, embedding_lr=None)
    assert unset.scaled_for(4).embedding_lr == 0.1  # unset: it was lr
    with pytest.raises(ConfigError, match="factor"):
        base.scaled_for(0)
