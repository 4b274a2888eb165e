"""The benchmarks' modules, imported as ``flow bench`` runs them, and the Spark session of the
benchmarks' integration tests (one for the test session)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from pyspark.sql import SparkSession

from flow.config import StackConfig
from spark_jobs.session import get_session

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def benchmark(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """``benchmark(name)``: benchmarks/NAME.py as a module, the folder on the path as under
    ``flow bench`` (the benchmarks import each other by name)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module


@pytest.fixture(scope="session")
def spark(running_stack: StackConfig) -> Iterator[SparkSession]:
    session = get_session(running_stack, app_name="primus-flow-tests")
    yield session
    session.stop()
