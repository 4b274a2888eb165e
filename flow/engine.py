"""Engines are plugins: ``flow`` finds Spark (and later the trainers) through entry points.

``flow`` is the engine-neutral core and never imports ``spark_jobs`` or ``trainers``. An engine
package registers itself under the entry-point group ``primus_flow.engines`` (see
``pyproject.toml``); the CLI, the handoff and ``flow.pipeline.run_main`` reach it through
:func:`load_engine`. Without the package installed, the error names the extra to install.

This module is the interface only (what an engine is asked, with which :class:`RunOptions`, and
how one is found), so it sits below the pipeline model in the layers and imports none of it.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from flow.config import StackConfig
from flow.errors import ConfigError, EngineNotFoundError

__all__ = [
    "CONNECTORS",
    "ENGINE_GROUP",
    "TRAINER_GROUP",
    "BatchEngine",
    "Launch",
    "Mode",
    "RunOptions",
    "TensorBackend",
    "load_engine",
    "load_tensor_backend",
    "parse_connectors",
]

ENGINE_GROUP = "primus_flow.engines"
TRAINER_GROUP = "primus_flow.trainers"
_EXTRAS = {"spark": "spark", "torch": "train"}

Mode = Literal["available-now", "continuous"]

CONNECTORS = ("delta", "kafka")
"""Connectors a job can go without, so that its driver starts with fewer jars; Iceberg's (the
stack's catalog) is always there. A job's set is a frozenset of these (None: all of them)."""


def parse_connectors(text: str) -> frozenset[str] | None:
    """``--connectors``: ``all`` (None), ``none``, or a comma list such as ``kafka,delta``."""
    if text.strip() == "all":
        return None
    if text.strip() == "none":
        return frozenset()
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(names - set(CONNECTORS))
    if unknown:
        raise ConfigError(
            f"--connectors {text!r}: no connector {', '.join(unknown)}; give all, none or a "
            f"comma list of {', '.join(CONNECTORS)} (Iceberg is always there)"
        )
    return names


@dataclass(frozen=True)
class RunOptions:
    """How to run a pipeline: which stages, and for how long; what ``flow run pipelines/x.py
    ...`` chooses on its command line (flags choose this, never what the pipeline is)."""

    stages: tuple[str, ...] = ()
    """Stages to run, in the pipeline's order; empty: all of them."""
    mode: Mode = "available-now"
    """``available-now``: streams process what has arrived and stop. ``continuous``: they keep
    running (until ``duration_s`` passes, if set)."""
    duration_s: float | None = None
    feature_state: str | None = None
    """Feature state version to use; default: the latest fitted for the spec."""
    tracking: bool = True
    """Log to MLflow."""
    since_snapshot: int | None = None
    """Backfill stages read only the Iceberg snapshots of their events after this one."""
    max_restarts: int = 10
    """Live stages: how many times a failed query is started again from its checkpoint (with
    backoff from 2 s to a minute: ten restarts ride out about six minutes of outage)."""
    summary: bool = True
    """Print the stages' table when the run ends (``--no-summary``: not, for a caller that
    prints its own, as ``flow demo`` does; MLflow has the counts either way)."""
    result_file: Path | None = None
    """Where the run's outcome goes as JSON, rewritten as each stage ends: its MLflow run and
    each ended stage's counts as the summary shows them (``flow run --json`` asks for it
    through FLOW_RUN_RESULT)."""

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts {self.max_restarts}: give 0 or more")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ConfigError(f"--duration {self.duration_s} must be positive")
        if self.duration_s is not None and self.mode != "continuous":
            raise ConfigError("--duration applies to --continuous runs")


@dataclass(frozen=True)
class Launch:
    """A command to run, and the environment variables it needs on top of the current ones."""

    argv: list[str]
    env: Mapping[str, str] = field(default_factory=dict)
    private_files: tuple[Path, ...] = ()
    """Files only this user can read that hold the command's secrets (:mod:`flow.secrets`);
    whoever runs the command deletes them when it ends."""
    on_exit: tuple[Callable[[int], None], ...] = ()
    """What whoever runs the command calls with its exit code when it ends."""
    notes: tuple[str, ...] = ()
    """Lines to show the user before the command runs."""


@runtime_checkable
class BatchEngine(Protocol):
    """What ``flow submit`` / ``flow run`` and pipeline files need from a Spark-like engine."""

    def submit_options(
        self,
        stack: StackConfig,
        master: str | None = None,
        connectors: frozenset[str] | None = None,
    ) -> list[str]:
        """Launcher options that give a job on ``master`` (default: the stack's) the stack
        (jars, catalogs, ...), with only ``connectors`` of :data:`CONNECTORS` (None: all)."""
        ...

    def submit_command(
        self, argv: Sequence[str], stack: StackConfig, connectors: frozenset[str] | None = None
    ) -> Launch:
        """The launch of ``argv`` (launcher options, the app, its arguments) with the stack,
        with only ``connectors`` of :data:`CONNECTORS` (None: all)."""
        ...

    def warm_driver_app(self) -> Path:
        """The application ``flow driver start`` launches (with :meth:`submit_command`): a
        driver that serves ``flow run``'s jobs (flow.workflows.warm)."""
        ...

    def run(self, spec: Any, stack: StackConfig, options: RunOptions) -> int:
        """Run a pipeline definition in this process; the exit code."""
        ...

    def export_dataframe(
        self, frame: Any, where: str, channel: str, options: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Write a DataFrame to a handoff channel (one commit); facts about what was written."""
        ...


@runtime_checkable
class TensorBackend(Protocol):
    """What turns a handoff channel into a framework's data loader (PyTorch: ``trainers``)."""

    def dataloader(
        self, where: str, channel: str, *, world: Any, options: Any, columns: Any
    ) -> Any: ...


def _plugin(group: str, name: str, kind: type) -> Any:
    found = [ep for ep in importlib.metadata.entry_points(group=group) if ep.name == name]
    if not found:
        names = sorted(ep.name for ep in importlib.metadata.entry_points(group=group))
        extra = _EXTRAS.get(name, name)
        raise EngineNotFoundError(
            f"no {group} plugin {name!r} is installed (installed: {', '.join(names) or 'none'}); "
            f"install it with: pip install 'primus-flow[{extra}]'"
        )
    plugin = found[0].load()()
    if not isinstance(plugin, kind):
        raise EngineNotFoundError(
            f"entry point {found[0].value} does not provide a {kind.__name__}"
        )
    return plugin


def load_engine(name: str) -> BatchEngine:
    """The engine registered as ``name``."""
    engine: BatchEngine = _plugin(ENGINE_GROUP, name, BatchEngine)
    return engine


def load_tensor_backend(name: str = "torch") -> TensorBackend:
    """The tensor backend registered as ``name``."""
    backend: TensorBackend = _plugin(TRAINER_GROUP, name, TensorBackend)
    return backend
