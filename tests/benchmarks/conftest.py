"""The Spark session of the benchmarks' integration tests (one for the test session)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from flow.config import StackConfig
from spark_jobs.session import get_session


@pytest.fixture(scope="session")
def spark(running_stack: StackConfig) -> Iterator[SparkSession]:
    session = get_session(running_stack, app_name="primus-flow-tests")
    yield session
    session.stop()
