"""``flow retrain PIPELINE.py``: incremental batch retraining, champion/challenger.

1. The pipeline's backfill stage and the Iceberg table of its events: the table's current
   snapshot against the one the last successful retraining read (an MLflow run of experiment
   ``retrain-<pipeline>``, tag ``flow.retrain.snapshot``). No new snapshot: nothing is trained
   and the run says so.
2. The backfill stage runs over only the snapshots appended since (``--since-snapshot``), with
   the feature state the channel was written with (so the champion's tables still fit), adding
   a commit to the stage's channel.
3. A trainer reads only the new commits, warm-started from the registry's champion, holds a
   share of the buckets out, evaluates the new model and the champion on them, and moves the
   ``champion`` alias only if the new AUC is not worse by more than the margin.

Every retraining, trained or not, is one MLflow run with its outcome and reason as tags.
"""

from __future__ import annotations

import inspect
import json
import runpy
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.handoff.channel import Channel
from flow.pipeline.model import BackfillStage, Pipeline
from flow.pipeline.sources import IcebergSource
from flow.storage import namespace_locations
from flow.tracking import PARENT_RUN_ENV, MlflowTracker
from flow.training import TrainConfig, parse_args, save_config
from flow.workflows.schedule import exclusive

__all__ = [
    "EXIT_CODES",
    "RetrainOutcome",
    "RetrainSettings",
    "load_pipeline",
    "retrain",
    "services_needed",
]

DONE = ("promoted", "kept")
EXIT_CODES: dict[str, int] = {"promoted": 0, "kept": 3, "nothing-new": 4, "busy": 5}
"""``flow retrain``'s exit code for each outcome (an error is 1): a scheduler tells a promotion
from a kept champion, and a run with nothing to do (nothing new, or another one running) from
both, without reading its output. docs/scheduling.md maps them for Airflow and cron."""


@dataclass(frozen=True)
class RetrainOutcome:
    outcome: str
    """``promoted``, ``kept`` (the champion stays), ``nothing-new`` or ``busy`` (another
    retraining of the pipeline was running)."""
    reason: str
    snapshot: int
    run_id: str


def load_pipeline(app: str, namespace: str | None = None) -> Pipeline:
    """The Pipeline a pipeline file builds: its function named like the file, called as is, or
    with ``namespace`` where given and the function takes one (``flow demo`` runs
    pipelines/ctr_demo.py with ``--namespace demo``: its channels are checked as ``demo``)."""
    path = Path(app)
    if not path.exists():
        raise ConfigError(f"no pipeline file {app}; give a path such as pipelines/ctr_backfill.py")
    found = runpy.run_path(str(path), run_name="flow_pipeline")
    make = found.get(path.stem)
    pipeline = None
    if callable(make):
        takes = "namespace" in inspect.signature(make).parameters
        pipeline = make(namespace=namespace) if namespace and takes else make()
    if not isinstance(pipeline, Pipeline):
        raise ConfigError(
            f"{app} has no function {path.stem}() returning a Pipeline; retraining needs one "
            "(as pipelines/ctr_backfill.py has ctr_backfill())"
        )
    return pipeline


def services_needed(pipeline: Pipeline) -> tuple[str, ...]:
    """The stack's services a retraining of ``pipeline`` uses (``flow.stack.SERVICE_NAMES``):
    the catalog its backfill reads and MLflow (runs, registry); Kafka only for a pipeline with
    Kafka sources. Left out, a service is neither started nor checked: on a scheduler's worker
    configured for remote MLflow, a local broker would be a process nobody asked for."""
    kafka = ("kafka",) if "kafka" in pipeline.connectors() else ()
    return (*kafka, "iceberg", "mlflow")


def _backfill(pipeline: Pipeline) -> tuple[BackfillStage, IcebergSource]:
    for stage in pipeline.stages:
        if isinstance(stage, BackfillStage):
            events = pipeline.source(stage.events, used_by=f"stage {stage.name!r}")
            if isinstance(events, IcebergSource):
                return stage, events
    raise ConfigError(
        f"pipeline {pipeline.name!r} has no backfill stage over Iceberg events to retrain from"
    )


def _current_snapshot(stack: StackConfig, table: str) -> int:
    from flow.stack.iceberg import open_catalog

    snapshot = open_catalog(stack.catalog).load_table(table).current_snapshot()
    if snapshot is None:
        raise ConfigError(f"table {table} has no snapshot yet: there is nothing to train on")
    return int(snapshot.snapshot_id)


def _last_success(tracker: MlflowTracker) -> dict[str, str] | None:
    # MLflow filters tags by equality only: the latest of each outcome, then the newer one.
    found: list[Any] = []
    for outcome in DONE:
        runs = tracker.client.search_runs(
            [tracker.experiment_id],
            filter_string=f"tags.`flow.retrain.outcome` = '{outcome}'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        found += runs
    latest = max(found, key=lambda r: r.info.start_time, default=None)
    return dict(latest.data.tags) if latest is not None else None


@dataclass(frozen=True)
class RetrainSettings:
    """What a retraining trains and how it judges the result."""

    model_name: str
    """The registered model whose ``champion`` alias the retraining may move."""
    margin: float = 0.002
    """AUC the new model may lose against the champion and still be promoted."""
    holdout_share: float = 0.125
    train_args: str = ""
    """More trainer options, e.g. ``--lr 0.01``."""
    output_to_stderr: bool = False
    """The trainer's output on stderr (``flow retrain --json`` keeps stdout for its document)."""


def retrain(
    stack: StackConfig,
    app: str,
    settings: RetrainSettings,
    launch_spark: Callable[[Sequence[str], dict[str, str]], int],
    say: Callable[[str], None],
) -> RetrainOutcome:
    pipeline = load_pipeline(app)
    # The user's trainer options are checked now, not after the backfill has run.
    parse_args(shlex.split(settings.train_args), base=TrainConfig(channels=("-",)), prog="--train")
    with exclusive(stack.home / "schedule" / f"{pipeline.name}.lock") as mine:
        if not mine:
            reason = f"another retraining of {pipeline.name} is running; this one is skipped"
            say(reason)
            return RetrainOutcome("busy", reason, -1, "")
        return _retrain(stack, app, pipeline, settings, launch_spark, say)


def _retrain(
    stack: StackConfig,
    app: str,
    pipeline: Pipeline,
    settings: RetrainSettings,
    launch_spark: Callable[[Sequence[str], dict[str, str]], int],
    say: Callable[[str], None],
) -> RetrainOutcome:
    model_name = settings.model_name
    stage, events = _backfill(pipeline)
    snapshot = _current_snapshot(stack, events.table)
    tracker = MlflowTracker(stack.mlflow.tracking_uri, f"retrain-{pipeline.name}")
    last = _last_success(tracker)
    channel = Channel(namespace_locations(stack, pipeline.namespace).handoff.uri, stage.channel)
    params = {"pipeline": app, "model": model_name, "margin": settings.margin, "snapshot": snapshot}
    with tracker.pipeline_run("retrain", params=params) as run:
        if last is not None and int(last["flow.retrain.snapshot"]) == snapshot:
            reason = f"no snapshot of {events.table} since {snapshot}: nothing new to train on"
            run.set_tags({"flow.retrain.outcome": "nothing-new", "flow.retrain.reason": reason})
            say(reason)
            return RetrainOutcome("nothing-new", reason, snapshot, run.run_id)
        env = {PARENT_RUN_ENV: run.run_id}
        after = int(last["flow.retrain.commit"]) if last is not None else -1
        if last is not None or not (channel.exists() and channel.commit_ids()):
            since = last["flow.retrain.snapshot"] if last is not None else None
            state = channel.meta().feature_state if channel.exists() else None
            argv = [app, "--stage", stage.name]
            argv += ["--since-snapshot", since] if since else []
            argv += ["--feature-state", state] if state else []
            say(f"backfill of {events.table} " + (f"after snapshot {since}" if since else "(all)"))
            if launch_spark(argv, env):
                raise ConfigError(f"the backfill of {app} failed; see its output above")
        commit = max(channel.commit_ids(), default=-1)
        decision = _train(channel, after, settings, run.run_id)
        outcome = "promoted" if decision["promote"] else "kept"
        run.set_tags(
            {
                "flow.retrain.outcome": outcome,
                "flow.retrain.reason": decision["reason"],
                "flow.retrain.snapshot": str(snapshot),
                "flow.retrain.commit": str(commit),
            }
        )
        say(f"{model_name}: {outcome} ({decision['reason']})")
        return RetrainOutcome(outcome, decision["reason"], snapshot, run.run_id)


def _train(channel: Channel, after: int, settings: RetrainSettings, parent: str) -> dict[str, Any]:
    """The trainer over the new commits, warm-started, deciding promotion; its decision."""
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "result.json"
        config = TrainConfig(
            handoff=channel.root.uri,
            channels=(channel.name,),
            after_commit=after,
            holdout_share=settings.holdout_share,
            register_as=settings.model_name,
            init_from_champion=True,
            promote_margin=settings.margin,
            parent_run_id=parent,
            experiment=f"retrain-{settings.model_name}",
            result_file=result,
            checkpoint_dir=str(Path(folder) / "checkpoints"),
        )
        # The user's own trainer options (``flow retrain --train "--lr 0.01"``) go on top,
        # read by the trainer's own generated parser.
        config = parse_args(shlex.split(settings.train_args), base=config, prog="--train")
        file = save_config(config, Path(folder) / "trainer.json")
        done = subprocess.run(
            [sys.executable, "-m", "trainers", "train", "--config", str(file)],
            check=False,
            stdout=2 if settings.output_to_stderr else None,  # fd 2: see flow.terminal.to_stderr
        )
        if done.returncode != 0 or not result.exists():
            raise ConfigError(f"the trainer failed (exit {done.returncode}); see its output above")
        summary: dict[str, Any] = json.loads(result.read_text())
    decision: dict[str, Any] | None = summary.get("decision")
    if decision is None:
        raise ConfigError("the trainer made no promotion decision (no held-out rows?)")
    return decision
