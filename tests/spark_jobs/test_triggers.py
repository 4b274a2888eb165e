"""A live stage's trigger is checked when the pipeline is built; Spark must agree with the check."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from flow.errors import ConfigError
from flow.pipeline.schema import check_trigger
from spark_jobs.jvm import JavaError, standalone_jvm

pytestmark = pytest.mark.integration

WRITTEN = (
    "10 seconds", "1 second", "2 seconds", "500 milliseconds", "1 minute", "1.5 seconds",
    "0.5 second", "1 minute 30 seconds", "2 hours", "1 day", "1 week", "10 SECONDS", "0 seconds",
    "interval 10 seconds", "10s", "10 sec", "10", "-1 seconds", "1 month", "1 year",
    "1.5 minutes", "once", "available-now", "",
)  # fmt: skip


@pytest.fixture(scope="module")
def trigger_class() -> Iterator[Any]:
    """Spark's ``Trigger`` from a bare driver JVM: parsing needs no session or stack."""
    with standalone_jvm() as jvm:
        yield jvm.org.apache.spark.sql.streaming.Trigger


def _flow_accepts(value: str) -> bool:
    try:
        check_trigger(value, "trigger")
    except ConfigError:
        return False
    return True


def _spark_accepts(trigger_class: Any, value: str) -> bool:
    try:
        trigger_class.ProcessingTime(value)
    except JavaError:
        return False
    return True


@pytest.mark.parametrize("value", WRITTEN)
def test_the_check_and_spark_agree_on_what_a_trigger_may_be(trigger_class: Any, value: str) -> None:
    assert _flow_accepts(value) == _spark_accepts(trigger_class, value)
