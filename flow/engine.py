"""Engines are plugins: ``flow`` finds Spark (and later the trainers) through entry points.

``flow`` is the engine-neutral core and never imports ``spark_jobs`` or ``trainers``. An engine
package registers itself under the entry-point group ``primus_flow.engines`` (see
``pyproject.toml``); the CLI and ``pipelines/`` reach it through :func:`load_engine`. Without the
package installed, the error names the extra to install.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from flow.config import StackConfig
from flow.errors import EngineNotFoundError, FlowError
from flow.pipeline.model import Pipeline
from flow.pipeline.run import RunOptions, parse_run_args

__all__ = [
    "ENGINE_GROUP",
    "TRAINER_GROUP",
    "BatchEngine",
    "Launch",
    "TensorBackend",
    "load_engine",
    "load_tensor_backend",
    "run_main",
]

ENGINE_GROUP = "primus_flow.engines"
TRAINER_GROUP = "primus_flow.trainers"
_EXTRAS = {"spark": "spark", "torch": "train"}


@dataclass(frozen=True)
class Launch:
    """A command to run, and the environment variables it needs on top of the current ones."""

    argv: list[str]
    env: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class BatchEngine(Protocol):
    """What ``flow submit`` / ``flow run`` and pipeline files need from a Spark-like engine."""

    def submit_options(self, stack: StackConfig) -> list[str]:
        """Launcher options that give a job the stack (jars, catalogs, ...)."""
        ...

    def submit_command(self, argv: Sequence[str], stack: StackConfig) -> Launch:
        """The launch of ``argv`` (launcher options, the app, its arguments) with the stack."""
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


def run_main(spec: Any, engine: str = "spark", argv: Sequence[str] | None = None) -> None:
    """Entry of a pipeline file: ``if __name__ == "__main__": run_main(my_pipeline())``.

    Works under ``spark-submit`` (the session keeps spark-submit's settings) and under ``flow
    run``; ``argv`` (default: the command line) chooses stages and run mode for a
    :class:`~flow.pipeline.Pipeline`. Exits with the engine's exit code.
    """
    try:
        options = RunOptions()
        if isinstance(spec, Pipeline):
            args = sys.argv[1:] if argv is None else argv
            options = parse_run_args(args, [s.name for s in spec.stages])
        code = load_engine(engine).run(spec, StackConfig.from_env(), options)
    except FlowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 1
    raise SystemExit(code)
