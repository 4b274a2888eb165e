"""CowClip at large batch: DeepFM at batch 1k and 32k on data whose click probability is known.

    flow bench cowclip --device cuda                        # 8M training rows, 1M test rows
    flow bench cowclip --rows 400000 --test-rows 100000     # a quick look on CPU

A generated CTR world gives every row its true click probability: 26 categorical fields with
skewed id frequencies (ids log-uniform over 100 to 100,000 values, so a few ids are frequent
and most are rare, as in Criteo), 13 dense features, and a true logit made of a per-id effect
of every field, pairwise interactions of six fields' id vectors and a dense effect. Labels are
drawn from it. The **oracle** (the true probability) is the yardstick: its AUC and log loss are
the best any model can reach on the test rows.

DeepFM (embedding 16, MLP 400-400-400, Adam) trains one epoch on the same rows, in the same
seeded order, in each run:

* ``1k``: batch 1,024, the base learning rates;
* ``1k cowclip``: the same with CowClip (r = 1, ζ = 1e-5);
* ``32k sqrt``: batch 32,768 without CowClip, every learning rate times sqrt(32) (the usual
  rule for Adam);
* ``32k same``: batch 32,768 without CowClip, the base learning rates;
* ``32k cowclip``: batch 32,768 with CowClip and its scaling rule
  (``OptimConfig.scaled_for(32)``: embedding rate unchanged, dense rate times sqrt(32),
  embedding L2 times 32);
* ``32k sqrt cowclip``: CowClip with every learning rate times sqrt(32).

Every run warms its dense learning rate up over the first ``--warmup`` share of its steps (the
rule asks for it; the small batch gets it too, so only the batch and the rule differ).
Reported per run: test AUC and log loss, their distance to the oracle and to the 1k run.
Results print and go to $FLOW_HOME/bench/cowclip-<time>.json.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _results import save
from torch import Tensor, nn

from flow.console import console
from flow.pipeline.state import Layout
from flow.training import ModelConfig, OptimConfig
from trainers.metrics import BinaryMetrics
from trainers.models import build_model
from trainers.optim import CowClip, build_optimizer

NEEDS_SERVICES = False
NEEDS_SPARK = False
DENSE, SPARSE, INTERACTING, VECTOR = 13, 26, 6, 4
CARDINALITIES = [10 ** (2 + j % 4) for j in range(SPARSE)]
out = console()


# -- the world -----------------------------------------------------------------------------------


@dataclass
class Truth:
    """The true model: click logit = bias + Σ effect[f][id] + Σ pairs <v_f, v_g> + w·dense."""

    effects: list[Tensor]
    vectors: list[Tensor]
    dense_weights: Tensor
    bias: float

    @classmethod
    def draw(cls, seed: int, device: torch.device) -> Truth:
        g = torch.Generator(device="cpu").manual_seed(seed)
        effects = [(torch.randn(c, generator=g) * 0.2).to(device) for c in CARDINALITIES]
        vectors = [
            (torch.randn(CARDINALITIES[f], VECTOR, generator=g) * 0.3).to(device)
            for f in range(INTERACTING)
        ]
        dense = (torch.randn(DENSE, generator=g) * 0.2).to(device)
        return cls(effects, vectors, dense, bias=-1.5)

    def rows(self, n: int, seed: int, device: torch.device) -> dict[str, Tensor]:
        """``n`` rows: features, the true probability ``p`` and a label drawn from it."""
        g = torch.Generator(device=device).manual_seed(seed)
        cards = torch.tensor(CARDINALITIES, dtype=torch.float64, device=device)
        u = torch.rand(n, SPARSE, generator=g, device=device, dtype=torch.float64)
        sparse = (torch.exp(u * torch.log(cards)) - 1).long().clamp(min=0)  # log-uniform ids
        # log1p(-u), u in [0, 1): finite. log(u) is -inf for the u = 0 a GPU's RNG does draw.
        counts = -torch.log1p(-torch.rand(n, DENSE, generator=g, device=device)) * 20
        dense = torch.log1p(counts)
        dense = (dense - dense.mean(0)) / dense.std(0)
        logit = torch.full((n,), self.bias, device=device)
        for f in range(SPARSE):
            logit += self.effects[f][sparse[:, f]]
        picked = [self.vectors[f][sparse[:, f]] for f in range(INTERACTING)]
        for a in range(INTERACTING):
            for b in range(a + 1, INTERACTING):
                logit += (picked[a] * picked[b]).sum(1)
        logit += dense @ self.dense_weights
        p = torch.sigmoid(logit)
        label = (torch.rand(n, generator=g, device=device) < p).float()
        return {"dense": dense.float(), "sparse": sparse, "label": label, "p": p}


LAYOUT = Layout(
    dense=tuple(f"d{j}" for j in range(DENSE)),
    sparse=tuple((f"c{j}", c) for j, c in enumerate(CARDINALITIES)),
    sequences=(),
)


# -- one run -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    name: str
    batch: int
    optim: OptimConfig


def runs(base: OptimConfig, small: int, large: int) -> list[Run]:
    factor = large / small
    sqrt = math.sqrt(factor)
    embedding_lr = base.embedding_lr or base.lr
    return [
        Run(f"{small // 1024}k", small, base),
        Run(f"{small // 1024}k cowclip", small, replace(base, cowclip=True)),
        Run(
            f"{large // 1024}k sqrt",
            large,
            replace(base, lr=base.lr * sqrt, embedding_lr=embedding_lr * sqrt),
        ),
        Run(f"{large // 1024}k same", large, base),
        Run(f"{large // 1024}k cowclip", large, base.scaled_for(factor)),
        Run(
            f"{large // 1024}k sqrt cowclip",
            large,
            replace(base, lr=base.lr * sqrt, embedding_lr=embedding_lr * sqrt, cowclip=True),
        ),
    ]


def evaluate(model: nn.Module, rows: dict[str, Tensor], bf16: bool) -> dict[str, float]:
    metrics = BinaryMetrics(capacity=len(rows["label"]))
    model.eval()
    with torch.no_grad():
        for start in range(0, len(rows["label"]), 65_536):
            part = {k: v[start : start + 65_536] for k, v in rows.items()}
            with torch.autocast(part["label"].device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(part)
            metrics.update(logits.float(), part["label"])
    model.train()
    found = metrics.compute()
    return {"auc": found["auc"], "logloss": found["logloss"]}


def train(
    run: Run, train_rows: dict[str, Tensor], args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    model = build_model(
        ModelConfig("deepfm", embedding_dim=16, hidden=(400, 400, 400), max_embedding_rows=2**17),
        LAYOUT,
    ).to(device)
    optimizer = build_optimizer(model, run.optim)
    clip = CowClip.from_config(run.optim)
    dense = [g for g in optimizer.param_groups if g["name"] == "dense"]
    peak = run.optim.lr
    n = len(train_rows["label"])
    steps = n // run.batch
    warm = max(1, int(args.warmup * steps))
    order = torch.randperm(
        n, generator=torch.Generator(device=device).manual_seed(1), device=device
    )
    started = time.perf_counter()
    for step in range(steps):
        for group in dense:
            group["lr"] = peak * min(1.0, (step + 1) / warm)
        index = order[step * run.batch : (step + 1) * run.batch]
        batch = {k: v.index_select(0, index) for k, v in train_rows.items() if k != "p"}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
            logits = model(batch)
        loss = nn.functional.binary_cross_entropy_with_logits(logits.float(), batch["label"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        if clip is not None:
            clip.apply(model, batch)
        optimizer.step()
        if (step + 1) % max(1, steps // 4) == 0:
            out.print(f"    {run.name}: step {step + 1}/{steps}, loss {float(loss.detach()):.4f}")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    return {"steps": steps, "seconds": seconds, **evaluate(model, args.test, args.bf16)}


# -- main --------------------------------------------------------------------------------------


def oracle(rows: dict[str, Tensor]) -> dict[str, float]:
    metrics = BinaryMetrics(capacity=len(rows["label"]))
    p = rows["p"].double().clamp(1e-12, 1 - 1e-12)
    metrics.update(torch.log(p / (1 - p)), rows["label"])
    found = metrics.compute()
    return {"auc": found["auc"], "logloss": found["logloss"]}


def main() -> None:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description="CowClip: small vs large batch, known truth")
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--rows", type=int, default=8 * 2**20)
    parser.add_argument("--test-rows", type=int, default=2**20)
    parser.add_argument("--small", type=int, default=1024)
    parser.add_argument("--large", type=int, default=32 * 1024)
    parser.add_argument("--lr", type=float, default=1e-3, help="base dense learning rate")
    parser.add_argument("--embedding-lr", type=float, default=1e-3)
    parser.add_argument("--l2", type=float, default=0.0, help="base embedding L2 penalty")
    parser.add_argument("--warmup", type=float, default=0.1, help="share of steps")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", help="comma-separated run names")
    parser.add_argument("--result-file", type=Path, help="also write the results here")
    args = parser.parse_args()
    device = torch.device(args.device)
    args.bf16 = device.type == "cuda" if args.bf16 is None else args.bf16
    world = Truth.draw(args.seed, device)
    out.print(f"drawing {args.rows:,} training and {args.test_rows:,} test rows ...")
    train_rows = world.rows(args.rows, seed=1, device=device)
    args.test = world.rows(args.test_rows, seed=2, device=device)
    truth = oracle(args.test)
    positive = float(train_rows["label"].mean())
    out.print(f"  positive rate {positive:.3f}; oracle AUC {truth['auc']:.4f}")
    base = OptimConfig(
        embedding="adam",  # the paper's optimizer for both groups (the trainer's default: Adagrad)
        lr=args.lr,
        embedding_lr=args.embedding_lr,
        embedding_weight_decay=args.l2,
    )
    chosen = runs(base, args.small, args.large)
    if args.only:
        wanted = set(args.only.split(","))
        chosen = [r for r in chosen if r.name in wanted]
    results: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(),
        "device": torch.cuda.get_device_name(device) if cuda and device.type == "cuda" else "cpu",
        "rows": args.rows,
        "test_rows": args.test_rows,
        "positive_rate": positive,
        "oracle": truth,
        "runs": {},
    }
    for run in chosen:
        out.print(f"  {run.name} (batch {run.batch:,}) ...")
        found = train(run, train_rows, args, device)
        found["optim"] = {k: v for k, v in asdict(run.optim).items() if v is not None}
        found["auc_gap_to_oracle"] = truth["auc"] - found["auc"]
        results["runs"][run.name] = found
    small = results["runs"].get(f"{args.small // 1024}k", {}).get("auc")
    for found in results["runs"].values():
        if small is not None:
            found["auc_vs_small"] = found["auc"] - small
    show(results)
    path = save("cowclip", results, also=args.result_file)
    out.print(f"results: {path}")


def show(results: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"DeepFM, one epoch of {results['rows']:,} rows, on {results['device']}")
    for column in ("run", "steps", "AUC", "log loss", "AUC vs 1k", "AUC gap to oracle", "s"):
        table.add_column(column, justify="left" if column == "run" else "right")
    truth = results["oracle"]
    table.add_row("oracle", "", f"{truth['auc']:.4f}", f"{truth['logloss']:.4f}", "", "", "")
    for name, r in results["runs"].items():
        table.add_row(
            name,
            f"{r['steps']:,}",
            f"{r['auc']:.4f}",
            f"{r['logloss']:.4f}",
            f"{r['auc_vs_small']:+.4f}" if "auc_vs_small" in r else "",
            f"{r['auc_gap_to_oracle']:.4f}",
            f"{r['seconds']:.0f}",
        )
    out.print(table)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
