"""The Spark engine, registered as the ``spark`` entry point of ``primus_flow.engines``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flow.config import StackConfig
from flow.engine import Launch
from flow.errors import ConfigError
from flow.pipeline.model import Pipeline
from flow.pipeline.run import RunOptions
from flow.pipeline.smoke import SmokeCheck
from spark_jobs import submit

__all__ = ["SparkEngine"]


class SparkEngine:
    """Launches jobs through spark-submit and runs pipeline definitions in a Spark driver."""

    def submit_options(
        self,
        stack: StackConfig,
        master: str | None = None,
        connectors: frozenset[str] | None = None,
    ) -> list[str]:
        return submit.submit_options(stack, master, connectors)

    def submit_command(
        self, argv: Sequence[str], stack: StackConfig, connectors: frozenset[str] | None = None
    ) -> Launch:
        return submit.submit_command(argv, stack, connectors)

    def warm_driver_app(self) -> Path:
        return Path(__file__).with_name("warm.py")

    def run(self, spec: Any, stack: StackConfig, options: RunOptions) -> int:
        if isinstance(spec, Pipeline):
            from spark_jobs.runner import run_pipeline

            reports = run_pipeline(spec, stack, options)
            return 0 if all(r.reconciled for r in reports) else 1
        if isinstance(spec, SmokeCheck):
            from spark_jobs.smoke import run_smoke

            return 0 if run_smoke(spec, stack).reconciled else 1
        raise ConfigError(
            f"the spark engine cannot run a {type(spec).__name__}; it runs Pipeline and SmokeCheck"
        )

    def export_dataframe(
        self, frame: Any, where: str, channel: str, options: Mapping[str, Any]
    ) -> dict[str, Any]:
        from flow.handoff import Channel
        from spark_jobs.handoff import ExportOptions, export

        commit = export(
            frame,
            Channel(where, channel),
            int(options.get("batch_id", 0)),
            options=ExportOptions(**{k: v for k, v in options.items() if k != "batch_id"}),
            writer="convert",
        )
        if commit is None:
            return {"rows": Channel(where, channel).commit(int(options.get("batch_id", 0))).rows}
        return {"rows": commit.rows, "shards": len(commit.shards), "bytes": commit.bytes}
