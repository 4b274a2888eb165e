"""The hashed-vs-dynamic bench (benchmarks/embeddings.py): equal memory, a churning world."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from types import ModuleType

import pytest
import torch


@pytest.fixture
def bench(benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark("embeddings")


def _args(**changes: object) -> argparse.Namespace:
    settings = {
        "hours": 3,
        "rows_per_hour": 4096,
        "items_per_hour": 500,
        "item_life": 2,
        "users": 300,
        "rows": 256,
        "min_count": 2,
        "ttl_steps": 8,
        "dim": 4,
        "batch": 512,
        "seed": 0,
    }
    return argparse.Namespace(**{**settings, **changes})


def test_both_runs_hold_equal_table_memory_and_report_their_metrics(bench: ModuleType) -> None:
    args = _args()
    world = bench.World.draw(args, torch.device("cpu"))
    first = world.hour(1, 1000, seed=1)
    assert first["ids"].dtype == torch.int64
    assert bool(first["new"].any())
    results = {
        name: bench.run(name, config, world, args, torch.device("cpu"))
        for name, config in bench.configs(args).items()
    }
    hashed, dynamic = results["hashed"], results["dynamic"]
    assert abs(hashed["table_bytes"] - dynamic["table_bytes"]) / dynamic["table_bytes"] < 0.01
    for result in results.values():
        assert 0.5 < result["auc"] < result["oracle_auc"] + 0.05
        assert [h["distinct_items"] for h in result["hourly"]] == [500, 1000, 1500]
    # The dynamic table's memory does not grow with the ids: it holds at most its rows.
    assert {h["table_bytes"] for h in dynamic["hourly"]} == {dynamic["table_bytes"]}
    assert all(h["item_rows_held"] <= 255 for h in dynamic["hourly"])
