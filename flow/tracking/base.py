"""What every tracker offers: the run and tracker protocols, a metric point, the no-op tracker."""

from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from flow import versions

PARENT_RUN_ENV = "FLOW_PARENT_RUN_ID"

__all__ = [
    "PARENT_RUN_ENV",
    "MetricPoint",
    "NullTracker",
    "Run",
    "Tracker",
    "stack_versions",
]


def stack_versions() -> dict[str, str]:
    """Versions of the stack, logged as parameters so every run says what it ran on."""
    found: dict[str, str] = {}
    for dist in (
        "primus-flow",
        "pyspark",
        "delta-spark",
        "pyiceberg",
        "pyarrow",
        "mlflow",
        "torch",
    ):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[f"version.{dist}"] = importlib.metadata.version(dist)
    found["version.iceberg-spark-runtime"] = versions.ICEBERG
    found["version.delta-spark-jar"] = versions.DELTA
    found["version.kafka-broker"] = versions.KAFKA_BROKER
    return found


class MetricPoint(NamedTuple):
    """One value of one metric, with the step and the time (ms since the epoch) it was logged at.

    Kept with the value so that a point sent late (after a tracking outage) lands where it
    belongs, and so that sending it twice is harmless (MLflow ignores an identical point).
    """

    key: str
    value: float
    step: int
    timestamp_ms: int


class Run(Protocol):
    """A tracked run: the pipeline run or one of its stages."""

    run_id: str

    def log_params(self, params: Mapping[str, Any]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...

    def set_tags(self, tags: Mapping[str, str]) -> None: ...

    def log_dict(self, data: Any, artifact_file: str) -> None: ...


class Tracker(Protocol):
    """Where runs go: MLflow, or nowhere."""

    def pipeline_run(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> contextlib.AbstractContextManager[Run]: ...

    def stage(self, name: str) -> contextlib.AbstractContextManager[Run]: ...


@dataclass
class _NullRun:
    run_id: str = "untracked"
    metrics: dict[str, float] = field(default_factory=dict)

    def log_params(self, params: Mapping[str, Any]) -> None:
        return None

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.metrics.update(metrics)

    def log_points(self, points: Sequence[MetricPoint]) -> None:
        self.metrics.update((p.key, p.value) for p in points)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        return None

    def log_dict(self, data: Any, artifact_file: str) -> None:
        return None


class NullTracker:
    """Tracks nothing; for tests of transforms and for runs with tracking switched off."""

    @contextlib.contextmanager
    def pipeline_run(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> Iterator[Run]:
        yield _NullRun()

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[Run]:
        yield _NullRun()
