"""flow bench serve (benchmarks/serve.py): the model it builds and what it measures."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from flow.transform import FeatureTransform
from pipelines.ctr import ctr_features


@pytest.fixture
def serve(benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark("serve")


def test_the_generated_impressions_carry_every_raw_input_and_fit_the_ctr_spec(
    serve: ModuleType,
) -> None:
    raw = serve.raw_impressions(500)
    spec = ctr_features()
    state = serve.fit(spec, raw)
    state.check(spec)  # every fitted feature has its vocabulary, moments or cut points
    assert set(state.vocabularies["device"]) == {"ios", "android", "web"}
    rows = FeatureTransform(spec, state).apply(raw)
    assert rows.num_rows == 500
    assert 8 < len(state.boundaries["price_bucket"]) <= 15  # 16 buckets; ties collapse


@pytest.mark.integration  # a model logged to MLflow's SQLite store: ~15 s
def test_a_short_run_in_process_reports_both_sizes(serve: ModuleType, tmp_path: Path) -> None:
    args = argparse.Namespace(
        requests=20, warmup=2, rows=300, model=None, no_http=True, profile=False
    )
    results = serve.run(args, tmp_path)
    assert [(r["path"], r["rows"]) for r in results] == [("in-process", 1), ("in-process", 100)]
    for result in results:
        assert result["requests"] == 20
        assert 0 < result["p50_ms"] <= result["p99_ms"]
