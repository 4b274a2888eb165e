"""Hashed against dynamic embedding tables at equal memory, on a world of churning ids.

    flow bench embeddings                       # CPU, ~2M rows, a few minutes
    flow bench embeddings --device cuda         # the same on a GPU
    flow bench embeddings --hours 4 --rows-per-hour 50000   # a quick look

The world (pure torch, no Spark): every hour ``--items-per-hour`` new items are born with random
64-bit ids; an impression picks an item's age from an exponential (recent items are shown most,
older ones go stale and vanish after ``--item-life`` hours) and, within that hour's items, one
by a Zipf law; users follow a Zipf law over ``--users``. The true click logit is a bias + an item
effect + a user effect + <user vector, item vector> + a category effect + a position effect, so
every row's true probability is known (the oracle). Distinct item ids grow ``--hours``-fold.

Both models are DeepFM over the same rows in the same order, one pass, scored on each batch
before training on it (progressive validation): the ``hashed`` run hashes the raw item and user
ids into its tables, the ``dynamic`` run gives them dynamic tables (``trainers.dynamic``). Equal
memory: the hashed tables get as many rows as the same bytes buy them, the dynamic table's
mapping (keys, counters, sketch) counted against it. Reported per run: progressive AUC over all
rows after the first hour and on items born in the current hour, log loss, the AUC gap to the
oracle, samples/s and the tables' bytes and occupied rows hour by hour.
Results print and go to $FLOW_HOME/bench/embeddings-<time>.json.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from _results import save
from torch import Tensor

from flow.console import console
from flow.pipeline.state import Layout
from flow.training import EmbeddingConfig, ModelConfig, OptimConfig
from trainers.dynamic import DynamicTable, hash_ids
from trainers.metrics import binary_auc
from trainers.models import CTRModel, build_model
from trainers.optim import build_optimizer

NEEDS_SERVICES = False
NEEDS_SPARK = False
CATEGORIES, VECTOR = 50, 4
LAYOUT = Layout(
    dense=("position",),
    sparse=(("category", CATEGORIES + 1),),
    sequences=(),
    ids=("item_id", "user_id"),
)
out = console()


@dataclass
class World:
    """The churning catalogue and its users, with every row's true click probability."""

    items_per_hour: int
    life: int
    users: int
    item_effect: Tensor
    item_vector: Tensor
    user_effect: Tensor
    user_vector: Tensor
    category_effect: Tensor
    user_weights: Tensor
    rank_weights: Tensor

    @classmethod
    def draw(cls, args: argparse.Namespace, device: torch.device) -> World:
        g = torch.Generator().manual_seed(args.seed)
        items = args.items_per_hour * args.hours
        zipf = 1.0 / (torch.arange(args.users) + 1.0) ** 1.05
        ranks = 1.0 / (torch.arange(args.items_per_hour) + 1.0) ** 1.05
        return cls(
            items_per_hour=args.items_per_hour,
            life=args.item_life,
            users=args.users,
            item_effect=(torch.randn(items, generator=g) * 0.8).to(device),
            item_vector=(torch.randn(items, VECTOR, generator=g) * 0.5).to(device),
            user_effect=(torch.randn(args.users, generator=g) * 0.4).to(device),
            user_vector=(torch.randn(args.users, VECTOR, generator=g) * 0.5).to(device),
            category_effect=(torch.randn(CATEGORIES, generator=g) * 0.3).to(device),
            user_weights=zipf[torch.randperm(args.users, generator=g)].to(device),
            rank_weights=ranks.to(device),
        )

    def hour(self, hour: int, n: int, seed: int) -> dict[str, Tensor]:
        """``n`` impressions of ``hour``: features, ``p`` (the truth), the label, ``age``."""
        device = self.item_effect.device
        g = torch.Generator(device=device).manual_seed(seed)
        # Age in hours: exponential with mean 1, cut at the item life and at the first hour.
        age = (-torch.log1p(-torch.rand(n, generator=g, device=device))).floor().long()
        age = torch.minimum(age.clamp(max=self.life - 1), torch.tensor(hour, device=device))
        rank = torch.multinomial(self.rank_weights, n, replacement=True, generator=g)
        item = (hour - age) * self.items_per_hour + rank
        user = torch.multinomial(self.user_weights, n, replacement=True, generator=g)
        category = item % CATEGORIES
        position = torch.randint(1, 11, (n,), generator=g, device=device).float()
        logit = (
            -1.6
            + self.item_effect[item]
            + self.user_effect[user]
            + (self.item_vector[item] * self.user_vector[user]).sum(1)
            + self.category_effect[category]
            - 0.15 * (position - 1)
        )
        p = torch.sigmoid(logit)
        label = torch.bernoulli(p, generator=g)
        # Raw 64-bit ids, as a catalogue would have them (not dense indices).
        raw_item = hash_ids(item, 0) * 2**31 + hash_ids(item, 1) + 1
        raw_user = hash_ids(user + 2**40, 2) * 2**31 + user
        return {
            "dense": ((position - 5.5) / 2.9).unsqueeze(1),
            "sparse": (category + 1).unsqueeze(1),
            "ids": torch.stack([raw_item, raw_user], dim=1),
            "label": label,
            "p": p,
            "new": age == 0,
        }


def table_bytes(model: CTRModel, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the id tables: weights, their optimizer state, the dynamic mappings."""
    total = 0
    for table in model.embedding_tables():
        rows = sum(table.id_rows)
        per_row = table.weight.element_size() * table.dim
        parts = getattr(optimizer, "parts", {"": optimizer})  # a CombinedOptimizer's, or itself
        states = [part.state.get(table.weight, {}) for part in parts.values()]
        copies = 1 + sum(
            1 for state in states for v in state.values() if torch.is_tensor(v) and v.dim() == 2
        )
        total += rows * per_row * copies
    if model.id_tables is not None:
        total += sum(b.numel() * b.element_size() for b in model.id_tables.buffers())
    return total


def configs(args: argparse.Namespace) -> dict[str, ModelConfig]:
    base = {"name": "deepfm", "embedding_dim": args.dim, "hidden": (128, 64)}
    dynamic = tuple(
        EmbeddingConfig(
            name,
            kind="dynamic",
            rows=args.rows,
            min_count=args.min_count,
            ttl=args.ttl_steps,
            eviction="lru",
        )
        for name in LAYOUT.ids
    )
    # Equal memory: per row a dynamic table holds weights and Adagrad sums of the embedding
    # (dim) and of the linear term (1), plus its mapping (see trainers.dynamic): 5 int64
    # per row and a sketch of 2 x width cells, each two int64.
    width = EmbeddingConfig("x", rows=args.rows, min_count=args.min_count).sketch_width
    sketch = 2 * (2 * width + 1) * 8 if args.min_count > 1 else 16
    per_row = (args.dim + 1) * 4 * 2
    dynamic_bytes = args.rows * (per_row + 5 * 8) + sketch + 8
    hashed_rows = dynamic_bytes // per_row
    hashed = tuple(EmbeddingConfig(n, kind="hashed", rows=hashed_rows) for n in LAYOUT.ids)
    return {
        "hashed": ModelConfig(**base, embeddings=hashed),
        "dynamic": ModelConfig(**base, embeddings=dynamic),
    }


def run(
    name: str, config: ModelConfig, world: World, args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    model = build_model(config, LAYOUT).to(device)
    optimizer = build_optimizer(model, OptimConfig(embedding_lr=0.05, lr=1e-3))
    scores, labels, news, truths = [], [], [], []
    hourly: list[dict[str, Any]] = []
    seconds, rows = 0.0, 0
    for hour in range(args.hours):
        data = world.hour(hour, args.rows_per_hour, seed=args.seed * 1000 + hour)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        logits = []
        for first in range(0, args.rows_per_hour, args.batch):
            batch = {k: v[first : first + args.batch] for k, v in data.items()}
            logit = model(batch)
            loss = F.binary_cross_entropy_with_logits(logit, batch["label"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            model.reset_new_rows(optimizer)
            optimizer.step()
            logits.append(logit.detach())
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds += time.perf_counter() - start
        rows += args.rows_per_hour
        if hour > 0:  # the first hour is warm-up: every id is new then
            scores.append(torch.cat(logits).float().cpu().numpy())
            labels.append(data["label"].cpu().numpy())
            news.append(data["new"].cpu().numpy())
            truths.append(data["p"].cpu().numpy())
        occupied = None
        if model.id_tables is not None and model.id_tables.tables:
            item = model.id_tables.tables["item_id"]
            occupied = int(item.occupied()) if isinstance(item, DynamicTable) else None
        hourly.append(
            {
                "hour": hour,
                "distinct_items": (hour + 1) * args.items_per_hour,
                "table_bytes": table_bytes(model, optimizer),
                "item_rows_held": occupied,
            }
        )
        out.print(f"    {name} hour {hour}: {rows / seconds:,.0f} rows/s")
    s, y, new, p = (np.concatenate(x) for x in (scores, labels, news, truths))
    prob = 1 / (1 + np.exp(-s.astype(np.float64)))
    logloss = float(-np.mean(y * np.log(prob + 1e-12) + (1 - y) * np.log(1 - prob + 1e-12)))
    return {
        "auc": binary_auc(s, y),
        "auc_new_items": binary_auc(s[new], y[new]),
        "oracle_auc": binary_auc(p, y),
        "oracle_auc_new_items": binary_auc(p[new], y[new]),
        "logloss": logloss,
        "samples_per_s": rows / seconds,
        "seconds": seconds,
        "table_bytes": hourly[-1]["table_bytes"],
        "rows": [e.rows for e in config.embeddings],
        "hourly": hourly,
    }


def main() -> None:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description="hashed vs dynamic tables at equal memory")
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--hours", type=int, default=10)
    parser.add_argument("--rows-per-hour", type=int, default=200_000)
    parser.add_argument("--items-per-hour", type=int, default=20_000)
    parser.add_argument("--item-life", type=int, default=3, help="hours an item is shown")
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--rows", type=int, default=1 << 15, help="dynamic table rows")
    parser.add_argument("--min-count", type=int, default=2)
    parser.add_argument("--ttl-steps", type=int, default=None, help="default: an hour's steps")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", help="hashed or dynamic")
    parser.add_argument(
        "--threads", type=int, help="torch CPU threads (on a loaded machine 1 measures best)"
    )
    parser.add_argument("--result-file", type=Path, help="also write the results here")
    args = parser.parse_args()
    if args.ttl_steps is None:
        args.ttl_steps = max(1, math.ceil(args.rows_per_hour / args.batch))
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    world = World.draw(args, device)
    chosen = configs(args)
    if args.only:
        chosen = {k: v for k, v in chosen.items() if k in args.only.split(",")}
    results: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "settings": {k: v for k, v in vars(args).items() if k != "result_file"},
        "runs": {},
    }
    for name, config in chosen.items():
        out.print(f"  {name}: tables of {[e.rows for e in config.embeddings]} rows ...")
        results["runs"][name] = run(name, config, world, args, device)
    show(results)
    path = save("embeddings", results, also=args.result_file)
    out.print(f"results: {path}")


def show(results: dict[str, Any]) -> None:
    from rich.table import Table

    s = results["settings"]
    table = Table(
        title=f"DeepFM, {s['hours']} hours x {s['rows_per_hour']:,} rows, {s['items_per_hour']:,} "
        f"new items/hour, on {results['device']}"
    )
    columns = ("run", "rows", "MB", "AUC", "AUC new", "oracle", "oracle new", "log loss", "rows/s")
    for column in columns:
        table.add_column(column, justify="left" if column == "run" else "right")
    for name, r in results["runs"].items():
        table.add_row(
            name,
            f"{r['rows'][0]:,}",
            f"{r['table_bytes'] / 2**20:.1f}",
            f"{r['auc']:.4f}",
            f"{r['auc_new_items']:.4f}",
            f"{r['oracle_auc']:.4f}",
            f"{r['oracle_auc_new_items']:.4f}",
            f"{r['logloss']:.4f}",
            f"{r['samples_per_s']:,.0f}",
        )
    out.print(table)


if __name__ == "__main__":
    main()
