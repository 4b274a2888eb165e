"""benchmarks/_results.py: every benchmark's result goes to $FLOW_HOME/bench/NAME-TIME.json,
and also where --result-file and ``flow bench --json`` (FLOW_BENCH_RESULT) ask."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from flow.config import BENCH_RESULT_ENV

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def results(
    benchmark: Callable[[str], ModuleType], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> ModuleType:
    monkeypatch.setenv("FLOW_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(BENCH_RESULT_ENV, raising=False)
    return benchmark("_results")


def test_a_result_goes_to_the_bench_folder_and_its_path_comes_back(
    results: ModuleType, tmp_path: Path
) -> None:
    path = results.save("fake", {"rows": 3, "where": tmp_path})
    assert path.parent == (tmp_path / "home" / "bench").resolve()
    assert path.name.startswith("fake-")
    assert path.suffix == ".json"
    assert json.loads(path.read_text()) == {"rows": 3, "where": str(tmp_path)}
    named = results.save("fake", [1], folder=tmp_path, at="20260101T000000", indent=1)
    assert named == tmp_path / "fake-20260101T000000.json"


def test_it_also_goes_where_result_file_and_flow_bench_json_ask(
    results: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(BENCH_RESULT_ENV, str(tmp_path / "for-flow-bench.json"))
    path = results.save("fake", {"rows": 3}, also=tmp_path / "given.json")
    for copy in (tmp_path / "given.json", tmp_path / "for-flow-bench.json"):
        assert copy.read_text() == path.read_text()


def test_every_benchmark_saves_through_it() -> None:
    # So that `flow bench --json NAME` has a result to print for every NAME.
    for script in sorted(BENCHMARKS.glob("[!_]*.py")):
        assert "from _results import save" in script.read_text(), f"{script.name} saves none"
