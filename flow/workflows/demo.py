"""``flow demo``: the whole product on the local stack, end to end, in a few minutes.

1. fresh data in the ``demo`` namespace: Iceberg users, items and days of impression and click
   history; a Kafka backlog of recent impressions and clicks with a share of malformed records;
2. one Spark job (``pipelines/ctr_demo.py``): the backfill stage fits the features over the
   history and writes channel ``backfill``; the live stage then works off the Kafka backlog in
   micro-batches, each a commit on channel ``live``;
3. beside it, a trainer (DLRM) reads ``backfill`` and then follows ``live`` as commits land;
4. a summary read back from MLflow, where every stage has its run under one parent run.

Each run starts the namespace afresh (topics, checkpoints, channels, feature state), so its
counts reconcile on their own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flow.config import StackConfig
from flow.storage import namespace_locations
from flow.training import ModelConfig, OptimConfig, TrainConfig

__all__ = ["DemoSize", "run_demo", "summarize"]

NAMESPACE = "demo"
MODEL_NAME = "ctr-demo"


@dataclass(frozen=True)
class DemoSize:
    days: int = 3
    per_day: int = 20_000
    live: int = 20_000
    per_batch: int = 5_000
    malformed_share: float = 0.02
    batch_size: int = 1024


def _reset(stack: StackConfig, say: Callable[[str], None]) -> None:
    from flow.stack.kafka import delete_topics
    from flow.workflows.loading import topics

    delete_topics(stack.kafka, topics(NAMESPACE).values())
    where = namespace_locations(stack, NAMESPACE)
    for folder in (where.checkpoints, where.handoff, where.feature_state):
        folder.remove()
    say(f"namespace {NAMESPACE}: topics, checkpoints, channels and feature state reset")


def _generate(stack: StackConfig, size: DemoSize, say: Callable[[str], None]) -> None:
    from flow.workflows.loading import produce_stream, write_history
    from flow.workflows.synthetic import SyntheticWorld

    now = datetime.now(UTC)
    history = write_history(
        stack,
        SyntheticWorld(seed=7, users=10_000, items=2_000),
        namespace=NAMESPACE,
        days=size.days,
        per_day=size.per_day,
        end=now - timedelta(hours=1),
        progress=say,
    )
    say(f"history: {history.impressions:,} impressions, {history.clicks:,} clicks in Iceberg")
    stream = produce_stream(
        stack,
        namespace=NAMESPACE,
        count=size.live,
        malformed_share=size.malformed_share,
        # Event times over the last 100 minutes: a negative is known only once its 30-minute
        # label window has passed the watermark, so the newest ~40 minutes stay pending.
        start=now - timedelta(minutes=100),
        span=timedelta(minutes=100),
        seed=11,
    )
    say(
        f"stream: {stream.impressions:,} impressions to Kafka, "
        f"{sum(stream.malformed.values()):,} malformed records among them"
    )


def run_demo(
    stack: StackConfig,
    size: DemoSize,
    launch_spark: Callable[[Sequence[str], dict[str, str]], int],
    say: Callable[[str], None],
) -> str:
    """Data, Spark job and trainer; the MLflow run they nest under."""
    from flow.workflows.together import run_together

    _reset(stack, say)
    _generate(stack, size, say)
    trainer = TrainConfig(
        channels=("backfill", "live"),
        namespace=NAMESPACE,
        model=ModelConfig("dlrm"),
        optim=OptimConfig(lr=0.01),
        batch_size=size.batch_size,
        log_every=20,
        event_time="ts",
        # The synthetic world's true click probability, when its rows carry it: the summary
        # prints the oracle's AUC beside the model's (rows without it are left out and counted).
        oracle="p_click",
        register_as=MODEL_NAME,
        checkpoint_every=100,
    )
    app = [
        "pipelines/ctr_demo.py",
        "--namespace",
        NAMESPACE,
        "--max-records-per-batch",
        str(size.per_batch),
    ]
    return run_together(app, trainer, 1, stack, launch_spark, say, experiment="pipeline-ctr_demo")


def _runs(stack: StackConfig, parent: str) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=stack.mlflow.tracking_uri)
    experiment = client.get_run(parent).info.experiment_id
    children = client.search_runs(
        [experiment], filter_string=f"tags.mlflow.parentRunId = '{parent}'"
    )
    return {r.info.run_name: r for r in children}


def summarize(stack: StackConfig, parent: str) -> dict[str, Any]:
    """The figures of a demo run, from its MLflow runs."""
    runs = _runs(stack, parent)
    stages = {}
    for name in ("backfill", "live"):
        if name in runs:
            m = runs[name].data.metrics
            stages[name] = {
                k: int(m.get(k, 0)) for k in ("rows_in", "rows_out", "dead_letters", "pending")
            } | {"reconciled": bool(m.get("reconciled", 0))}
    train = runs["train"].data.metrics if "train" in runs else {}
    return {
        "parent_run": parent,
        "stages": stages,
        "auc": train.get("run_progressive_auc"),
        "logloss": train.get("run_progressive_logloss"),
        "live_auc": train.get("run_progressive_auc.live"),
        "live_logloss": train.get("run_progressive_logloss.live"),
        "live_oracle_auc": train.get("run_progressive_oracle_auc.live"),
        "live_calibration": train.get(
            "run_progressive_calibration_corrected.live",
            train.get("run_progressive_calibration.live"),
        ),
        "samples_per_s": train.get("samples_per_s"),
        "data_stall_fraction": train.get("data_stall_fraction"),
        "trained_rows": int(train.get("rows", 0)),
        "freshness_p50_s": train.get("freshness_p50_s.live"),
        "freshness_p99_s": train.get("freshness_p99_s.live"),
        "ui": f"{stack.mlflow.tracking_uri}/#/experiments/"
        f"{runs['train'].info.experiment_id if 'train' in runs else ''}/runs/{parent}",
    }


def show(summary: dict[str, Any], console: Console) -> None:
    table = Table(title="demo: stages", title_justify="left")
    for header in ("stage", "rows in", "training rows", "dead letters", "pending", "counts"):
        table.add_column(header, justify="left" if header in ("stage", "counts") else "right")
    for name, s in summary["stages"].items():
        table.add_row(
            name,
            f"{s['rows_in']:,}",
            f"{s['rows_out']:,}",
            f"{s['dead_letters']:,}",
            f"{s['pending']:,}",
            "[green]reconcile[/]" if s["reconciled"] else "[red]do NOT reconcile[/]",
        )
    console.print(table)

    def fmt(value: float | None, pattern: str) -> str:
        return pattern.format(value) if value is not None else "n/a"

    lines = [
        ("trained on", f"{summary['trained_rows']:,} rows"),
        ("AUC, all rows (progressive)", fmt(summary["auc"], "{:.3f}")),
        ("AUC, live rows (progressive)", fmt(summary["live_auc"], "{:.3f}")),
        ("oracle AUC, the same rows", fmt(summary["live_oracle_auc"], "{:.3f}")),
        ("calibration, live rows", fmt(summary["live_calibration"], "{:.3f}")),
        ("log loss, live rows", fmt(summary["live_logloss"], "{:.4f}")),
        ("samples/s", fmt(summary["samples_per_s"], "{:,.0f}")),
        ("waiting for data", fmt(summary["data_stall_fraction"], "{:.1%} of the time")),
        ("event -> training, live p50", fmt(summary["freshness_p50_s"], "{:.0f} s")),
        ("event -> training, live p99", fmt(summary["freshness_p99_s"], "{:.0f} s")),
        ("model", f"registered as {MODEL_NAME}"),
        ("MLflow", summary["ui"]),
    ]
    for label, value in lines:
        console.print(f"  {label:30} {escape(value)}", highlight=False)
