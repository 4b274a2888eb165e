"""Tracking pipeline runs in MLflow: one parent run per pipeline run, one nested run per stage.

Trackers take an explicit tracking URI and never touch MLflow's process-global "active run", so a
Spark driver, a trainer and a test can each hold their own without stepping on each other. Stages
are tracked *around* transforms (``with tracker.stage("...")``), never inside them.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from flow import versions

PARENT_RUN_ENV = "FLOW_PARENT_RUN_ID"

__all__ = [
    "PARENT_RUN_ENV",
    "MlflowTracker",
    "NullTracker",
    "ResilientRun",
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


class _MlflowRun:
    def __init__(self, client: Any, run_id: str) -> None:
        self._client = client
        self.run_id = run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        # MLflow caps a parameter value at 6000 characters; longer ones belong in an artifact.
        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for start in range(0, len(items), 100):
            self._client.log_batch(self.run_id, params=items[start : start + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step or 0) for k, v in metrics.items()]
        self._client.log_batch(self.run_id, metrics=items)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self._client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_dict(self, data: Any, artifact_file: str) -> None:
        self._client.log_text(self.run_id, json.dumps(data, indent=2, default=str), artifact_file)


class MlflowTracker:
    """Runs in one MLflow experiment, through the tracking server at ``tracking_uri``."""

    def __init__(self, tracking_uri: str, experiment: str) -> None:
        from mlflow.tracking import MlflowClient

        # MLflow 3 prints a "View run" line to stdout whenever a run ends: one per stage here.
        # Pipelines print one summary link instead; export the variable as false to get them.
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id: str = (
            found.experiment_id if found else self.client.create_experiment(experiment)
        )
        self._parent: _MlflowRun | None = None

    @contextlib.contextmanager
    def _run(self, name: str, tags: dict[str, str]) -> Iterator[_MlflowRun]:
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
        handle = _MlflowRun(self.client, run.info.run_id)
        try:
            yield handle
        except BaseException:
            self.client.set_terminated(handle.run_id, status="FAILED")
            raise
        self.client.set_terminated(handle.run_id, status="FINISHED")

    @contextlib.contextmanager
    def pipeline_run(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> Iterator[Run]:
        """The parent run; stages opened inside it nest under it.

        With FLOW_PARENT_RUN_ID set (``flow run --train`` sets it for the Spark job and the
        trainer), that run is the parent instead: both processes' stages nest under one run.
        """
        outer = os.environ.get(PARENT_RUN_ENV)
        if outer:
            with self.attach(outer) as run:
                run.set_tags({f"flow.part.{name}": "yes", **(tags or {})})
                # Parameters cannot change once logged: each part prefixes its own.
                run.log_params(
                    {**stack_versions(), **{f"{name}.{k}": v for k, v in (params or {}).items()}}
                )
                yield run
            return
        with self._run(name, {"flow.kind": "pipeline", **(tags or {})}) as run:
            run.log_params({**stack_versions(), **(params or {})})
            self._parent = run
            try:
                yield run
            finally:
                self._parent = None

    @contextlib.contextmanager
    def attach(self, run_id: str) -> Iterator[Run]:
        """An existing run (another process's pipeline run) as the parent of the stages opened
        inside; it is neither created nor ended here."""
        self.experiment_id = self.client.get_run(run_id).info.experiment_id  # nest in its UI
        self._parent = _MlflowRun(self.client, run_id)
        try:
            yield self._parent
        finally:
            self._parent = None

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[Run]:
        """A nested run for one stage of the current pipeline run, timed."""
        tags = {"flow.kind": "stage", "flow.stage": name}
        if self._parent is not None:
            tags["mlflow.parentRunId"] = self._parent.run_id
        started = time.monotonic()
        with self._run(name, tags) as run:
            yield run
            run.log_metrics({"duration_s": time.monotonic() - started})


class ResilientRun:
    """A run whose logging never raises: a streaming job outlives its tracking server.

    A call that fails (server down, network) is reported once per outage and kept, with every
    call after it, in order; the queue is retried at most every ``retry_after`` seconds and on
    ``flush()``. Beyond ``max_pending`` calls the oldest are dropped, and counted.
    """

    def __init__(
        self,
        run: Run,
        report: Callable[[str], None],
        *,
        retry_after: float = 5.0,
        max_pending: int = 10_000,
    ) -> None:
        self.run = run
        self.run_id = run.run_id
        self.report = report
        self.retry_after = retry_after
        self.max_pending = max_pending
        self.pending: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.dropped = 0
        self._failed_at: float | None = None

    def _call(self, method: str, *args: Any, **kwargs: Any) -> None:
        self.pending.append((method, args, kwargs))
        if len(self.pending) > self.max_pending:
            del self.pending[0]
            self.dropped += 1
        if self._failed_at is None or time.monotonic() - self._failed_at >= self.retry_after:
            self.flush()

    def flush(self) -> bool:
        """Send what is queued; True when nothing is left."""
        while self.pending:
            method, args, kwargs = self.pending[0]
            try:
                getattr(self.run, method)(*args, **kwargs)
            except Exception as exc:  # any failure of the tracking client is survivable
                if self._failed_at is None:
                    self.report(
                        f"MLflow tracking failed ({type(exc).__name__}: {str(exc)[:200]}); "
                        f"keeping the calls and retrying every {self.retry_after:.0f}s"
                    )
                self._failed_at = time.monotonic()
                return False
            self.pending.pop(0)
        if self._failed_at is not None:
            self.report(f"MLflow tracking is back; {self.dropped} calls were dropped")
            self._failed_at = None
        return True

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._call("log_params", dict(params))

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self._call("log_metrics", dict(metrics), step=step)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._call("set_tags", dict(tags))

    def log_dict(self, data: Any, artifact_file: str) -> None:
        self._call("log_dict", data, artifact_file)
