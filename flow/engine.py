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

__all__ = ["ENGINE_GROUP", "BatchEngine", "Launch", "load_engine", "run_main"]

ENGINE_GROUP = "primus_flow.engines"
_EXTRAS = {"spark": "spark"}


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


def load_engine(name: str) -> BatchEngine:
    """The engine registered as ``name``."""
    found = [ep for ep in importlib.metadata.entry_points(group=ENGINE_GROUP) if ep.name == name]
    if not found:
        names = sorted(ep.name for ep in importlib.metadata.entry_points(group=ENGINE_GROUP))
        extra = _EXTRAS.get(name, name)
        raise EngineNotFoundError(
            f"no engine {name!r} is installed (installed: {', '.join(names) or 'none'}); "
            f"install it with: pip install 'primus-flow[{extra}]'"
        )
    engine = found[0].load()()
    if not isinstance(engine, BatchEngine):
        raise EngineNotFoundError(f"entry point {found[0].value} does not provide a BatchEngine")
    return engine


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
