"""The MLflow tracker: runs in one experiment of a tracking server, through its own client.

Trackers take an explicit tracking URI and never touch MLflow's process-global "active run", so a
Spark driver, a trainer and a test can each hold their own without stepping on each other.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from flow.errors import ServiceError
from flow.tracking.base import PARENT_RUN_ENV, MetricPoint, Run, stack_versions
from flow.tracking.experiments import runs_url, training_experiment

__all__ = ["CLIENT_LIMITS", "MlflowTracker", "bound_client_calls", "unreachable"]

CLIENT_LIMITS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}
"""How long one MLflow client call may take against a server that is down, set by
:class:`MlflowTracker` for its process where the variable is unset (export one to choose).

MLflow's own defaults (7 retries, backoff factor 2, 120 s timeout) let a single call to a dead
server take about 4 minutes (a hung one far longer), so an outage is noticed minutes late. With
these, a refused call fails in about 3 s and a hung one in about 35 s (3 tries of 10 s); the
calls are queued and retried by :class:`flow.tracking.ResilientRun` meanwhile. MLflow reads the
variables at every request and offers no per-client setting, so they hold for the whole process
(model logging and the registry too). The 10 s is per socket read, not per upload.
"""


_UNREACHABLE = frozenset(
    {
        "ConnectionError",  # requests'; the builtin's subclasses too
        "ConnectionRefusedError",
        "ConnectTimeout",
        "NewConnectionError",
        "MaxRetryError",
        "NameResolutionError",
        "ReadTimeout",
        "Timeout",
    }
)


def unreachable(error: BaseException) -> str | None:
    """Why the server could not be reached, if that is what ``error`` is (by the classes of its
    chain: MLflow raises its own exception from requests' and urllib3's), else None."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if any(kind.__name__ in _UNREACHABLE for kind in type(current).__mro__):
            text = str(current)
            for known in ("Connection refused", "timed out", "Name or service not known"):
                if known in text:
                    return known.lower()
            return type(current).__name__
        current = current.__cause__ or current.__context__
    return None


def bound_client_calls() -> None:
    """Set :data:`CLIENT_LIMITS` in this process's environment where they are unset."""
    for name, value in CLIENT_LIMITS.items():
        os.environ.setdefault(name, value)


class _MlflowRun:
    def __init__(self, client: Any, run_id: str, tracking_uri: str) -> None:
        self._client = client
        self.run_id = run_id
        self.tracking_uri = tracking_uri

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        # MLflow caps a parameter value at 6000 characters; longer ones belong in an artifact.
        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for start in range(0, len(items), 100):
            self._client.log_batch(self.run_id, params=items[start : start + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        now = int(time.time() * 1000)
        self.log_points([MetricPoint(k, float(v), step or 0, now) for k, v in metrics.items()])

    def log_points(self, points: Sequence[MetricPoint]) -> None:
        from mlflow.entities import Metric

        items = [Metric(p.key, p.value, p.timestamp_ms, p.step) for p in points]
        for start in range(0, len(items), 1000):  # MLflow's limit per log_batch
            self._client.log_batch(self.run_id, metrics=items[start : start + 1000])

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
        bound_client_calls()
        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.experiment = experiment
        self._experiment_id: str | None = None
        self._parent: _MlflowRun | None = None

    @property
    def experiment_id(self) -> str:
        """The id of the experiment runs are created in, looked up or created (of the
        machine-learning kind) on first use. A tracker that only attaches to another process's
        run never makes one: an experiment with no runs would clutter the UI."""
        if self._experiment_id is None:
            with self._reaching():
                self._experiment_id = training_experiment(self.client, self.experiment)
        return self._experiment_id

    def check(self) -> None:
        """Fail now, in one line (ServiceError), if the server cannot be reached: before a job
        starts its work, not when its first run opens."""
        with self._reaching():
            self.client.search_experiments(max_results=1)

    @contextlib.contextmanager
    def _reaching(self) -> Iterator[None]:
        """A server that cannot be reached as one line naming it and what to do, not MLflow's
        traceback of urllib3's: said where a run starts, so a job fails at once, before work."""
        try:
            yield
        except Exception as exc:
            reason = unreachable(exc)
            if reason is None:
                raise
            raise ServiceError(
                f"the MLflow tracking server at {self.tracking_uri} cannot be reached "
                f"({reason}): start it (`flow services up`), set MLFLOW_TRACKING_URI to yours, "
                "or run without tracking (--no-tracking)"
            ) from exc

    def runs_url(self, run_id: str | None = None) -> str:
        """The UI's page of run ``run_id`` (its stages listed as child runs), or of the
        experiment's runs table, opened on the runs rather than MLflow 3's GenAI view."""
        return runs_url(self.tracking_uri, self.experiment_id, run_id)

    @contextlib.contextmanager
    def _run(self, name: str, tags: dict[str, str]) -> Iterator[_MlflowRun]:
        experiment = self.experiment_id
        with self._reaching():
            run = self.client.create_run(experiment, run_name=name, tags=tags)
        handle = _MlflowRun(self.client, run.info.run_id, self.tracking_uri)
        try:
            yield handle
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (flow.console.terminating_as_interrupt)
            self.client.set_terminated(handle.run_id, status="KILLED")
            raise
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
        with self._reaching():
            self._experiment_id = self.client.get_run(run_id).info.experiment_id  # nest in its UI
        self._parent = _MlflowRun(self.client, run_id, self.tracking_uri)
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
