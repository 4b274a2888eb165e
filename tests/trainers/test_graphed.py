"""A training step captured as a CUDA graph trains exactly as the eager step does.

The CUDA cases run where a GPU is (``benchmarks/gpu.sh OUT check`` runs this file on the device
machine); on CPU only the refusals are checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from flow.errors import ConfigError
from flow.training import ModelConfig, OptimConfig, TrainConfig
from tests.trainers.channels import write
from tests.trainers.test_models import LAYOUT, NAMES, model, random_batch
from trainers.graphed import GraphedStep
from trainers.optim import build_optimizer
from trainers.train import train

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
ADAM = OptimConfig(embedding="adam", dense="adam", lr=0.01, embedding_lr=None)


def test_a_graph_step_on_cpu_is_refused_with_what_to_change():
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        GraphedStep(lambda batch: torch.zeros(()), torch.device("cpu"))


@pytest.mark.parametrize("embedding", ["adagrad", "sgd"])
def test_a_capturable_optimizer_other_than_adam_is_refused(embedding):
    with pytest.raises(ConfigError, match="needs Adam for both groups"):
        build_optimizer(model("dlrm"), OptimConfig(embedding=embedding), capturable=True)


def _trained(name: str, batches: list[dict[str, torch.Tensor]], graph: bool, bf16: bool):
    device = torch.device("cuda")
    m = model(name).to(device)
    optimizer = build_optimizer(m, ADAM, capturable=graph)

    def step(batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16, cache_enabled=False):
            logits = m(batch)
        loss = F.binary_cross_entropy_with_logits(logits.float(), batch["label"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        return loss.detach()

    run = GraphedStep(step, device, warmup=2) if graph else step
    losses = [run({k: v.to(device) for k, v in b.items()}).clone() for b in batches]
    return m, torch.stack(losses).cpu(), run


@cuda
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", NAMES)
def test_replayed_steps_train_as_the_eager_steps_do(name, bf16):
    # Twelve full batches (2 eager, 1 captured, 9 replayed), then a short one that runs eagerly.
    batches = [random_batch(LAYOUT, size=64, seed=s) for s in range(12)]
    batches.append(random_batch(LAYOUT, size=40, seed=99))
    eager, eager_losses, _ = _trained(name, batches, graph=False, bf16=bf16)
    graphed, graphed_losses, run = _trained(name, batches, graph=True, bf16=bf16)
    assert isinstance(run, GraphedStep)
    assert run.captured
    assert (run.steps, run.eager_steps) == (13, 1)
    # Kernels round differently from run to run (atomic adds in the embedding backward): close,
    # not bit-equal. In bf16 Adam turns a rounding difference in a near-zero gradient into a
    # full step the other way, so there each tensor's update is compared by direction.
    torch.testing.assert_close(graphed_losses, eager_losses, rtol=2e-2 if bf16 else 1e-4, atol=1e-4)
    start = model(name).state_dict()
    for (key, a), b in zip(eager.state_dict().items(), graphed.state_dict().values(), strict=True):
        if not bf16 or not a.is_floating_point():
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-3, msg=key)
            continue
        moved_eager, moved_graphed = (t.cpu().flatten() - start[key].flatten() for t in (a, b))
        similarity = F.cosine_similarity(moved_eager, moved_graphed, dim=0)
        assert similarity > 0.9, f"{key}: the graphed update points elsewhere ({similarity:.3f})"


@cuda
def test_each_replay_reads_the_new_batch_not_the_captured_one():
    batches = [random_batch(LAYOUT, size=64, seed=s) for s in range(6)]
    _, losses, _ = _trained("dlrm", batches, graph=True, bf16=False)
    _, again, _ = _trained("dlrm", batches[:3] + batches[3:4] * 3, graph=True, bf16=False)
    # Batch 4 differs from batch 3: a graph reading its captured inputs would give one loss.
    assert losses[4] != again[4]


# -- the trainer's --cuda-graph ---------------------------------------------------------------


def _config(root: Path, **changes: object) -> TrainConfig:
    base: dict[str, object] = {
        "handoff": str(root),
        "channels": ("train",),
        "model": ModelConfig("dlrm", embedding_dim=8, hidden=(32, 16), bottom=(16,)),
        "optim": OptimConfig(embedding="adam", dense="adam", lr=0.01, embedding_lr=None),
        "batch_size": 256,
        "window_batches": 4,
        "device": "cuda",
        "tracking": False,
        "log_every": 10_000,
        "checkpoint_dir": None,
        "eval_channel": "heldout",
    }
    return TrainConfig(**(base | changes))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"device": "cpu"}, "needs a CUDA device"),
        ({"compile": True}, "choose one"),
        ({"optim": OptimConfig(embedding="adagrad")}, "--embedding-optimizer adam"),
        ({"optim": OptimConfig(embedding="adam", cowclip=True)}, "leave --cowclip off"),
    ],
)
def test_the_trainers_cuda_graph_refuses_what_it_cannot_capture(tmp_path, changes, says):
    with pytest.raises(ConfigError, match=says):
        _config(tmp_path, cuda_graph=True, **changes)


@cuda
def test_the_trainer_with_a_cuda_graph_learns_as_the_eager_trainer_does(tmp_path):
    # 7,000 rows in batches of 256: 27 full batches (2 eager, 1 captured, 24 replayed) and a
    # short last one, run eagerly; progressive scores and the evaluation as without the graph.
    write(tmp_path, "train", [4000, 3000])
    write(tmp_path, "heldout", [3000], seed=99)
    eager = train(_config(tmp_path), say=lambda _: None)
    graphed = train(_config(tmp_path, cuda_graph=True), say=lambda _: None)
    assert graphed.rows == eager.rows == 7000
    assert graphed.metrics["auc"] > 0.75, graphed.metrics
    assert abs(graphed.metrics["auc"] - eager.metrics["auc"]) < 0.01
    assert abs(graphed.metrics["logloss"] - eager.metrics["logloss"]) < 0.01
