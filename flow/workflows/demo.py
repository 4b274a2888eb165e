"""``flow demo``: the whole product on the local stack, end to end, in a few minutes.

1. fresh data in the ``demo`` namespace: Iceberg users and items and days of impression and
   click history from a world that drifts (category appeal, new items), up to now;
2. one Spark job (``pipelines/ctr_demo.py``): the backfill stage fits the features over the
   history and writes channel ``backfill``; the live stage then runs for ``live_s`` seconds on
   Kafka in micro-batches, each a commit on channel ``live``, emitting every impression at once
   and again when its click comes (``immediate`` labels);
3. beside it, in real time, a stream of impressions stamped as they are sent, each click sent
   when it comes due (it starts when the backfill is done, with the live stage);
4. beside both, a trainer (DLRM) reads ``backfill`` and then follows ``live`` as commits land,
   correcting the immediate labels' bias (fake-negative weighted loss);
5. a summary read back from MLflow and the channel: the model's AUC beside the oracle's (the
   world's true click probability) on the same rows, the live rows' corrected positive rate and
   calibration, and freshness from production to commit and to training.

Each run starts the namespace afresh (topics, checkpoints, channels, feature state), so its
counts reconcile on their own.
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flow.config import StackConfig
from flow.handoff.channel import Channel
from flow.storage import namespace_locations
from flow.tracking import runs_url
from flow.training import ModelConfig, OptimConfig, TrainConfig
from flow.workflows.synthetic import DELAYS

__all__ = ["DemoSize", "run_demo", "summarize"]

NAMESPACE = "demo"
MODEL_NAME = "ctr-demo"


@dataclass(frozen=True)
class DemoSize:
    days: int = 3
    per_day: int = 20_000
    rate: float = 1000.0
    """Live impressions per second, in real time (their clicks come on top)."""
    live_s: float = 240.0
    """Seconds of new impressions in the real-time stream. The first minute's impressions are
    scored while none of their clicks has come yet (mean delay 45 s): a shorter or slower
    stream is mostly that minute, and its live AUC says little
    (docs/experiments/2026-11-23-freshness-and-demo.md)."""
    drain_s: float = 90.0
    """Seconds the stream goes on sending the clicks that come due, without new impressions,
    and the live stage with it: the last impressions' labels complete (mean click delay 45 s)."""
    trigger: str = "5 seconds"
    """The live stage's micro-batch interval."""
    per_batch: int = 20_000
    malformed_share: float = 0.02
    batch_size: int = 1024
    labels: Literal["window", "immediate"] = "immediate"
    """When the live stage emits an impression (LabelJoin.strategy)."""

    def command(self) -> str:
        """The ``flow demo`` command line that runs this size again."""
        options = {
            "--days": self.days,
            "--per-day": self.per_day,
            "--rate": f"{self.rate:g}",
            "--live-seconds": f"{self.live_s:g}",
            "--drain-seconds": f"{self.drain_s:g}",
            "--trigger": self.trigger,
            "--per-batch": self.per_batch,
            "--labels": self.labels,
        }
        return shlex.join(["flow", "demo", *(str(a) for o in options.items() for a in o)])


def _reset(stack: StackConfig, namespace: str, say: Callable[[str], None]) -> None:
    from flow.stack.kafka import delete_topics
    from flow.workflows.loading import topics

    delete_topics(stack.kafka, topics(namespace).values())
    where = namespace_locations(stack, namespace)
    for folder in (where.checkpoints, where.handoff, where.feature_state):
        folder.remove()
    say(f"namespace {namespace}: topics, checkpoints, channels and feature state reset")


def _history(
    stack: StackConfig, size: DemoSize, namespace: str, say: Callable[[str], None]
) -> None:
    from flow.workflows.loading import write_history
    from flow.workflows.synthetic import SyntheticWorld

    history = write_history(
        stack,
        SyntheticWorld(seed=7, users=10_000, items=2_000),
        namespace=namespace,
        days=size.days,
        per_day=size.per_day,
        end=datetime.now(UTC),
        progress=say,
    )
    say(f"history: {history.impressions:,} impressions, {history.clicks:,} clicks in Iceberg")


class _LiveStream:
    """The real-time stream of the demo, on a thread: it waits for the backfill's channel to
    close (the live stage starts then), sends for ``live_s`` seconds, and says what it sent."""

    def __init__(
        self, stack: StackConfig, size: DemoSize, namespace: str, say: Callable[[str], None]
    ) -> None:
        self.stack, self.size, self.namespace, self.say = stack, size, namespace, say
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="demo-stream", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        from flow.workflows.loading import produce_realtime
        from flow.workflows.streaming import Realtime

        try:
            where = namespace_locations(self.stack, self.namespace).handoff.uri
            backfill = Channel(where, "backfill")
            while not (backfill.exists() and backfill.closed()):
                if self.stopping.wait(1.0):
                    return
            size = self.size
            self.say(
                f"stream: {size.rate:g} impressions/s in real time for {size.live_s:g} s, then "
                f"{size.drain_s:g} s of the clicks still to come"
            )
            config = Realtime(
                rate=size.rate,
                duration=size.live_s,
                drain=size.drain_s,
                malformed_share=size.malformed_share,
            )
            report = produce_realtime(
                self.stack,
                config,
                namespace=self.namespace,
                progress=self.say,
                stop=self.stopping.is_set,
            )
            self.say(
                f"stream: {report.impressions:,} impressions ({sum(report.malformed.values()):,} "
                f"malformed) and {report.clicks:,} clicks sent; {report.pending_clicks:,} clicks "
                "not due yet when it stopped"
            )
        except BaseException as error:  # reported by the demo, which goes on without it
            self.error = error

    def __enter__(self) -> _LiveStream:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)
        if self.error is not None:
            self.say(f"stream: failed ({type(self.error).__name__}: {self.error})")


def run_demo(
    stack: StackConfig,
    size: DemoSize,
    launch_spark: Callable[[Sequence[str], dict[str, str]], int],
    say: Callable[[str], None],
    namespace: str = NAMESPACE,
) -> str:
    """Data, Spark job, real-time stream and trainer; the MLflow run they nest under."""
    from flow.workflows.together import run_together

    _reset(stack, namespace, say)
    _history(stack, size, namespace, say)
    trainer = TrainConfig(
        channels=("backfill", "live"),
        namespace=namespace,
        model=ModelConfig("dlrm"),
        optim=OptimConfig(lr=0.01),
        batch_size=size.batch_size,
        log_every=20,
        event_time="ts",
        # The synthetic world's true click probability: the summary prints the oracle's AUC
        # beside the model's, on the same rows.
        oracle="p_click",
        # What training on live rows is worth: the model as the backfill left it scores them too.
        frozen_after="backfill",
        register_as=MODEL_NAME,
        checkpoint_every=100,
    )
    app = [
        "pipelines/ctr_demo.py",
        "--namespace",
        namespace,
        "--max-records-per-batch",
        str(size.per_batch),
        "--trigger",
        size.trigger,
        "--label-strategy",
        size.labels,
        "--continuous",
        "--duration",
        f"{size.live_s + size.drain_s:g}",
    ]
    with _LiveStream(stack, size, namespace, say):
        return run_together(
            app, trainer, 1, stack, launch_spark, say, experiment="pipeline-ctr_demo"
        )


def _runs(stack: StackConfig, parent: str) -> tuple[str, dict[str, Any]]:
    """The experiment of run ``parent`` and its stage runs by name."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=stack.mlflow.tracking_uri)
    experiment = str(client.get_run(parent).info.experiment_id)
    children = client.search_runs(
        [experiment], filter_string=f"tags.mlflow.parentRunId = '{parent}'"
    )
    return experiment, {r.info.run_name: r for r in children}


def _figures(train: dict[str, float], channel: str) -> dict[str, float | None]:
    """A channel's progressive figures from the trainer's run: the model's and the oracle's."""
    names = ("auc", "logloss", "frozen_auc", "oracle_auc", "oracle_logloss", "oracle_rate")
    found = {name: train.get(f"run_progressive_{name}.{channel}") for name in names}
    # A click beyond the attribution window labels nothing, in either strategy: the true rate
    # of a label is the world's click rate less that share.
    rate = found["oracle_rate"]
    found["true_rate"] = rate * (1 - DELAYS.late_share) if rate is not None else None
    for name in ("positive_rate", "calibration"):  # the corrected ones where labels are biased
        corrected = train.get(f"run_progressive_{name}_corrected.{channel}")
        plain = train.get(f"run_progressive_{name}.{channel}")
        found[name] = corrected if corrected is not None else plain
    return found


def summarize(stack: StackConfig, parent: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    """The figures of a demo run, from its MLflow runs and its live channel."""
    from flow.insight.freshness import channel_freshness

    experiment_id, runs = _runs(stack, parent)
    stages = {}
    for name in ("backfill", "live"):
        if name in runs:
            m = runs[name].data.metrics
            keys = (
                "rows_in",
                "rows_out",
                "dead_letters",
                "pending",
                "relabelled",
                "labels_unmatched",
            )
            tags = runs[name].data.tags
            stages[name] = {k: int(m.get(k, 0)) for k in keys} | {
                "reconciled": bool(m.get("reconciled", 0)),
                "labels": tags.get("lineage.label_strategy", "none"),
                # A live stage's writer (spark_jobs.live.run.choose_writer), and why.
                "writer": tags.get("flow.live.writer", ""),
                "writer_reason": tags.get("flow.live.writer_reason", ""),
            }
    train = runs["train"].data.metrics if "train" in runs else {}
    handoff = namespace_locations(stack, namespace).handoff.uri
    live = Channel(handoff, "live")
    committed = channel_freshness(handoff, "live") if live.exists() else None
    return {
        "parent_run": parent,
        "stages": stages,
        "auc": train.get("run_progressive_auc"),
        "logloss": train.get("run_progressive_logloss"),
        "backfill": _figures(train, "backfill"),
        "live": _figures(train, "live"),
        "samples_per_s": train.get("samples_per_s"),
        "data_stall_fraction": train.get("data_stall_fraction"),
        "trained_rows": int(train.get("rows", 0)),
        "freshness": {
            "produced_to_committed": committed.produced_to_committed if committed else {},
            "produced_to_trained": {
                q: train.get(f"freshness_produced_{q}_s.live") for q in ("p50", "p99")
            },
            "event_to_trained": {q: train.get(f"freshness_{q}_s.live") for q in ("p50", "p99")},
        },
        "ui": runs_url(stack.mlflow.tracking_uri, experiment_id, parent),
    }


def _fmt(value: float | None, pattern: str) -> str:
    return pattern.format(value) if value is not None else "n/a"


def _lags(lags: dict[str, float | None]) -> str:
    return f"p50 {_fmt(lags.get('p50'), '{:.1f}')} s, p99 {_fmt(lags.get('p99'), '{:.1f}')} s"


def show(summary: dict[str, Any], console: Console) -> None:
    table = Table(title="demo: stages", title_justify="left")
    headers = ("stage", "labels", "rows in", "training rows", "dead letters", "pending", "counts")
    for header in headers:
        left = header in ("stage", "labels", "counts")
        table.add_column(header, justify="left" if left else "right")
    for name, s in summary["stages"].items():
        table.add_row(
            name,
            s["labels"],
            f"{s['rows_in']:,}",
            f"{s['rows_out']:,}" + (f" ({s['relabelled']:,} again)" if s["relabelled"] else ""),
            f"{s['dead_letters']:,}",
            f"{s['pending']:,}",
            "[green]reconcile[/]" if s["reconciled"] else "[red]do NOT reconcile[/]",
        )
    console.print(table)

    quality = Table(title="demo: the model against the oracle (progressive)", title_justify="left")
    for header in ("rows", "AUC", "frozen AUC", "oracle AUC", "log loss", "oracle log loss",
                   "positive rate", "true rate", "calibration"):  # fmt: skip
        quality.add_column(header, justify="left" if header == "rows" else "right")
    for channel in ("backfill", "live"):
        f = summary[channel]
        quality.add_row(
            channel,
            _fmt(f["auc"], "{:.3f}"),
            _fmt(f["frozen_auc"], "{:.3f}"),
            _fmt(f["oracle_auc"], "{:.3f}"),
            _fmt(f["logloss"], "{:.4f}"),
            _fmt(f["oracle_logloss"], "{:.4f}"),
            _fmt(f["positive_rate"], "{:.2%}"),
            _fmt(f["true_rate"], "{:.2%}"),
            _fmt(f["calibration"], "{:.3f}"),
        )
    console.print(quality)
    fresh = summary["freshness"]
    lines = [
        ("trained on", f"{summary['trained_rows']:,} rows"),
        ("samples/s", _fmt(summary["samples_per_s"], "{:,.0f}")),
        ("waiting for data", _fmt(summary["data_stall_fraction"], "{:.1%} of the time")),
        ("live: produced -> committed", _lags(fresh["produced_to_committed"])),
        ("live: produced -> trained", _lags(fresh["produced_to_trained"])),
        ("live: event -> trained", _lags(fresh["event_to_trained"])),
        ("model", f"registered as {MODEL_NAME}"),
        ("MLflow", summary["ui"]),
    ]
    for label, value in lines:
        console.print(f"  {label:30} {escape(value)}", highlight=False)
    console.print(
        "  (live positive rate and calibration are corrected for immediate labels: positives "
        "over impressions; the oracle is the world's true click probability, the true rate its "
        "mean less the clicks beyond the 30-minute window, which label nothing; frozen: the "
        "model as the backfill left it, on the same rows)",
        highlight=False,
    )
