"""Running a Pipeline in a Spark driver: its stages in order, each a nested MLflow run."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from flow.config import StackConfig
from flow.console import console as make_console
from flow.errors import ConfigError
from flow.pipeline.model import BackfillStage, Pipeline
from flow.pipeline.outputs import check_run
from flow.pipeline.run import RunOptions
from flow.pipeline.sources import IcebergSource
from flow.pipeline.state import FeatureState, layout
from flow.tracking import MlflowTracker, NullTracker, ResilientRun, Run, Tracker
from spark_jobs.backfill import run_backfill
from spark_jobs.live import run_live
from spark_jobs.report import StageReport
from spark_jobs.session import get_session
from spark_jobs.stage import check_derived

__all__ = ["describe", "run_pipeline"]

console = make_console()


def describe(pipeline: Pipeline) -> dict[str, Any]:
    """The definition as plain data, for MLflow (artifact and parameters)."""
    plain: dict[str, Any] = json.loads(
        json.dumps(
            {
                "name": pipeline.name,
                "namespace": pipeline.namespace,
                "sources": {
                    k: {"kind": type(v).__name__, **dataclasses.asdict(v)}
                    for k, v in pipeline.sources.items()
                },
                "stages": [
                    {"kind": type(s).__name__, **dataclasses.asdict(s)} for s in pipeline.stages
                ],
            },
            default=str,
        )
    )
    return plain


def _say(message: str) -> None:
    # One message, one line, however long: the job's output is a log people grep.
    console.print(
        f"[bold cyan]{escape('flow')}[/] {escape(message)}", highlight=False, soft_wrap=True
    )


def _log_state(run: Run, pipeline: Pipeline, stage_spec: Any, state: FeatureState) -> None:
    run.log_dict(
        json.loads(state.to_json()), f"feature_state/{state.spec_name}-{state.version}.json"
    )
    run.log_dict(layout(stage_spec, state).to_dict(), "layout.json")
    run.set_tags(
        {"flow.feature_state": state.version, "flow.spec_fingerprint": state.spec_fingerprint}
    )


def _batch_logger(run: ResilientRun) -> Callable[[dict[str, float], int], None]:
    """Per-micro-batch metrics of a live stage, as MLflow metric steps. They are queued and sent
    by ``run``'s own thread: a tracking outage never holds up a micro-batch, and the metrics
    logged during one arrive, with their steps, when the server is back."""

    def log(metrics: dict[str, float], step: int) -> None:
        run.log_metrics(metrics, step=step)

    return log


def _summary(reports: list[StageReport]) -> None:
    table = Table(title="pipeline run", header_style="bold")
    for column in (
        "stage",
        "events in",
        "training rows",
        "dead letters",
        "pending",
        "positives",
        "seconds",
        "counts",
    ):
        table.add_column(column, justify="right" if column not in ("stage", "counts") else "left")
    for r in reports:
        verdict = "[green]reconcile[/]" if r.reconciled else "[red]do NOT reconcile[/]"
        table.add_row(
            escape(r.stage),
            f"{r.events_input:,}",
            f"{r.training_rows:,}",
            f"{r.dead_letters:,}",
            f"{r.pending:,}",
            f"{r.positives:,}",
            f"{r.seconds:.0f}",
            verdict,
        )
    console.print(table)


def _write_result(
    path: Path | None, pipeline: Pipeline, tracker: Tracker, parent: Run, reports: list[StageReport]
) -> None:
    """The run's outcome so far as JSON at ``path`` (``flow run --json`` reads it when the job
    has ended): written whole as the run starts and after each stage, so a run that fails still
    says its MLflow run and the stages that ended."""
    if path is None:
        return
    run_id = url = None
    if isinstance(tracker, MlflowTracker):  # what `flow insight RUN_ID` takes
        run_id, url = parent.run_id, tracker.runs_url(parent.run_id)
    outcome = {
        "pipeline": pipeline.name,
        "mlflow_run_id": run_id,
        "mlflow_url": url,
        "stages": [r.summary() for r in reports],
    }
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(outcome, indent=2, default=str))
    partial.replace(path)


def incremental(pipeline: Pipeline, stage: BackfillStage, since: int | None) -> Pipeline:
    """``pipeline`` with ``stage``'s Iceberg events read from after snapshot ``since``."""
    events = pipeline.source(stage.events, used_by=f"stage {stage.name!r}")
    if since is None:
        return pipeline
    if not isinstance(events, IcebergSource):
        raise ConfigError(f"--since-snapshot needs Iceberg events; {stage.events!r} is not one")
    reading = dataclasses.replace(events, since_snapshot=since)
    return dataclasses.replace(pipeline, sources={**pipeline.sources, stage.events: reading})


def run_pipeline(pipeline: Pipeline, stack: StackConfig, options: RunOptions) -> list[StageReport]:
    """Run the chosen stages in order; each report says whether its counts reconcile."""
    chosen = [s for s in pipeline.stages if not options.stages or s.name in options.stages]
    check_run(stack, pipeline, options)  # each stage checks its own again when it starts
    tracker: Tracker = NullTracker()
    if options.tracking:  # an unreachable server is one line now, not a traceback after Spark
        tracker = mlflow = MlflowTracker(stack.mlflow.tracking_uri, f"pipeline-{pipeline.name}")
        mlflow.check()
    spark = get_session(stack, app_name=f"flow-{pipeline.name}")
    for stage in chosen:  # likewise: a later stage's Derived that Spark cannot resolve
        check_derived(spark, pipeline, stage)
    reports: list[StageReport] = []
    definition = describe(pipeline)
    params = {
        "pipeline": pipeline.name,
        "stages": ",".join(s.name for s in chosen),
        "mode": options.mode,
    }
    # Spec fingerprint -> the state a stage of this run fitted: a later stage of the same spec
    # that does not fit (a holdout, a live stage) uses exactly it, never what LATEST is then.
    fitted: dict[str, str] = {}
    with tracker.pipeline_run(pipeline.name, params=params) as parent:
        parent.log_dict(definition, "pipeline.json")
        _write_result(options.result_file, pipeline, tracker, parent, reports)
        for stage in chosen:
            state_version = options.feature_state or fitted.get(stage.features.fingerprint)
            with tracker.stage(stage.name) as run:
                run.log_params(
                    {
                        "channel": stage.channel,
                        "feature_spec": stage.features.name,
                        "spec_fingerprint": stage.features.fingerprint,
                        "features": len(stage.features.features),
                    }
                )
                if isinstance(stage, BackfillStage):
                    report, state = run_backfill(
                        spark,
                        incremental(pipeline, stage, options.since_snapshot),
                        stage,
                        stack,
                        feature_state=state_version,
                        progress=_say,
                    )
                    _log_state(run, pipeline, stage.features, state)
                    if stage.fit and state_version is None:
                        fitted[stage.features.fingerprint] = state.version
                else:
                    with ResilientRun(run, _say) as batches:
                        report = run_live(
                            spark,
                            pipeline,
                            stage,
                            stack,
                            dataclasses.replace(options, feature_state=state_version),
                            progress=_say,
                            on_batch=_batch_logger(batches),
                        )
                run.log_metrics(report.metrics())
                run.set_tags({f"lineage.{k}": str(v) for k, v in report.lineage.items()})
                run.set_tags({"flow.table": report.table, **report.tags})
                reports.append(report)
            _write_result(options.result_file, pipeline, tracker, parent, reports)
        parent.log_dict([dataclasses.asdict(r) for r in reports], "counts.json")
        parent.log_metrics({"reconciled": float(all(r.reconciled for r in reports))})
    if options.summary:
        _summary(reports)
    run_id = getattr(parent, "run_id", None)
    if isinstance(tracker, MlflowTracker) and run_id:  # what `flow insight RUN_ID` takes
        _say(f"MLflow run {run_id}: {tracker.runs_url(run_id)}")
    return reports
