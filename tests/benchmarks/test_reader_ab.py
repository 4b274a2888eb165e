"""The paired A/B of reader variants (benchmarks/reader_ab.py): what it pairs and reports."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


@pytest.fixture
def ab(benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark("reader_ab")


def test_variants_read_a_real_channel_every_round(ab: ModuleType, tmp_path: Path) -> None:
    handoff = importlib.import_module("handoff")
    handoff.write_channel(tmp_path, "criteo", [handoff.criteo_rows(40_000, seed=1)], seed=0)
    variants = [("base", {}), ("unverified", {"verify": False}), ("in-order", {"shuffle": False})]
    results = ab.compare(variants, tmp_path, rounds=2, shuffle=True)
    assert list(results) == ["base", "unverified", "in-order"]
    assert results["base"]["paired_ratio"] == 1.0
    for result in results.values():
        assert len(result["rows_per_s"]) == 2
        assert min(result["rows_per_s"]) > 0


def test_rounds_alternate_and_ratios_are_paired(
    ab: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Round r: the machine runs at speed[r]; variant b is 10 % faster except in round 1.
    speed, calls = [1.0, 3.0, 2.0], []
    untimed = 2  # one pass of each variant first

    def rate(root: Path, options: dict[str, Any], shuffle: bool) -> float:
        calls.append(options["name"])
        if len(calls) <= untimed:
            return 1.0
        r = (len(calls) - untimed - 1) // 2
        faster = 1.1 if options["name"] == "b" and r != 1 else 0.9 if options["name"] == "b" else 1
        return speed[r] * faster

    monkeypatch.setattr(ab, "rate", rate)
    results = ab.compare([("a", {"name": "a"}), ("b", {"name": "b"})], tmp_path, 3, True)
    assert calls[untimed:] == ["a", "b", "b", "a", "a", "b"]
    assert results["b"]["wins"] == 2
    assert results["b"]["paired_ratio"] == pytest.approx(1.1)
    assert results["b"]["median_rows_per_s"] == pytest.approx(2.2)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [("base", "NAME=JSON"), ("a={verify: false}", "is not JSON"), ("a=[1]", "JSON object")],
)
def test_a_malformed_variant_says_how_to_write_one(
    ab: ModuleType, text: str, complaint: str
) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=complaint):
        ab.parse_variant(text)
    assert ab.parse_variant('fast={"prefetch": 2}') == ("fast", {"prefetch": 2})
