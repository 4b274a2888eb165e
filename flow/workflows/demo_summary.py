"""The end of ``flow demo``: its figures read back from MLflow and the live channel, and the
one table a person reads, with a legend that says once what each figure is.

:func:`summarize` gathers the figures (also the ``--json`` document); :func:`show` lays them
out: the stage table (a column per stage, a row per figure), the trainer's run-wide figures,
the legend, then where everything else is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from flow.config import StackConfig
from flow.handoff.channel import Channel
from flow.storage import namespace_locations
from flow.tracking import runs_url
from flow.workflows.synthetic import DELAYS

__all__ = ["LEGEND", "STAGES", "legend", "render", "show", "stage_table", "summarize"]

STAGES = ("backfill", "live")
"""The demo's stages, its table's columns, in the order they run."""

_WINDOW_MIN = round(DELAYS.window.total_seconds() / 60)

LEGEND: tuple[tuple[str, str], ...] = (
    (
        "labels",
        "window: a row leaves once its label is final; immediate: at once, and again with its "
        "click",
    ),
    ("rows in", "records the stage read, valid or not"),
    (
        "training rows",
        "rows it wrote to its channel; live, immediate labels: every impression at once, and "
        "again (+N) as a positive when its click came",
    ),
    ("dead letters", "records refused with their reason (the namespace's dead-letter table)"),
    ("pending", "live impressions still waiting in the label join when the stage stopped"),
    (
        "counts",
        "reconcile: rows in = training rows (less those again) + dead letters + duplicates + "
        "pending",
    ),
    ("stage time", "how long the stage ran (its MLflow run)"),
    (
        "AUC, log loss",
        "progressive: each batch scored by the model before it trains on it, so on rows it has "
        "not seen",
    ),
    (
        "oracle",
        "the synthetic world's true click probability, scored as if it were a model, on the same "
        "rows: about the best a model can do",
    ),
    (
        "frozen",
        "the model as the backfill left it, scoring the live rows without learning from them: "
        "what following live is worth",
    ),
    (
        "positive rate",
        "clicks over impressions (live: corrected for immediate labels, which send a clicked "
        "impression twice)",
    ),
    (
        "true rate",
        f"the oracle's mean less the clicks after the {_WINDOW_MIN}-minute label window, which "
        "label nothing",
    ),
    ("calibration", "predicted clicks over labelled clicks: 1 is calibrated, above 1 too many"),
    (
        "freshness",
        "live rows, p50 and p99: from production (the Kafka record) to their commit on the "
        "channel, and to the training step that used them; event -> trained counts from the "
        "impression's own time",
    ),
    (
        "waiting for data",
        "share of the trainer's time spent waiting for rows: following a real-time stream, it "
        "waits for the next commit",
    ),
    (
        "log loss < oracle's",
        "possible, and no error: the oracle predicts the true probability but is scored against "
        f"the labels, which miss the clicks after {_WINDOW_MIN} minutes (and, live, hold a "
        "clicked impression first as a non-click); a model fitted to those labels can match "
        "them better, and on few rows by chance. AUC only ranks, and has no such edge",
    ),
)
"""Each figure of the end screen, defined once: (the name it goes by, what it is)."""


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


def _seconds(run: Any) -> float | None:
    """How long a stage's MLflow run lasted."""
    start, end = run.info.start_time, run.info.end_time
    return (end - start) / 1000 if start and end else None


def summarize(stack: StackConfig, parent: str, namespace: str = "demo") -> dict[str, Any]:
    """The figures of a demo run, from its MLflow runs and its live channel."""
    from flow.insight.freshness import channel_freshness

    experiment_id, runs = _runs(stack, parent)
    stages = {}
    for name in STAGES:
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
                "seconds": _seconds(runs[name]),
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
            # The trainer's legs of it, measured (trainers.result.LEGS).
            **{
                leg: {q: train.get(f"{leg}_{q}_s.live") for q in ("p50", "p99")}
                for leg in ("committed_to_picked_up", "picked_up_to_trained")
            },
        },
        "ui": runs_url(stack.mlflow.tracking_uri, experiment_id, parent),
    }


def _fmt(value: float | None, pattern: str) -> str:
    return pattern.format(value) if value is not None else "-"


def _lags(lags: dict[str, float | None]) -> str:
    if not any(v is not None for v in lags.values()):
        return "-"
    return f"p50 {_fmt(lags.get('p50'), '{:.1f}')} s, p99 {_fmt(lags.get('p99'), '{:.1f}')} s"


def _stage_rows(stage: dict[str, Any] | None) -> list[str]:
    if stage is None:
        return ["-"] * 7
    again = f" (+{stage['relabelled']:,} again)" if stage["relabelled"] else ""
    seconds = stage.get("seconds")
    return [
        stage["labels"],
        f"{stage['rows_in']:,}",
        f"{stage['rows_out']:,}{again}",
        f"{stage['dead_letters']:,}",
        f"{stage['pending']:,}",
        "[green]reconcile[/]" if stage["reconciled"] else "[red]do NOT reconcile[/]",
        f"{seconds:,.0f} s" if seconds is not None else "-",
    ]


def _model_rows(f: dict[str, float | None]) -> list[str]:
    return [
        _fmt(f.get("auc"), "{:.3f}"),
        _fmt(f.get("frozen_auc"), "{:.3f}"),
        _fmt(f.get("oracle_auc"), "{:.3f}"),
        _fmt(f.get("logloss"), "{:.4f}"),
        _fmt(f.get("oracle_logloss"), "{:.4f}"),
        _fmt(f.get("positive_rate"), "{:.2%}"),
        _fmt(f.get("true_rate"), "{:.2%}"),
        _fmt(f.get("calibration"), "{:.3f}"),
    ]


_STAGE_FIGURES = (
    "labels", "rows in", "training rows", "dead letters", "pending", "counts", "stage time",
)  # fmt: skip
_MODEL_FIGURES = (
    "AUC", "frozen AUC", "oracle AUC", "log loss", "oracle log loss", "positive rate",
    "true rate", "calibration",
)  # fmt: skip
_FRESHNESS_FIGURES = ("produced -> committed", "produced -> trained", "event -> trained")


def stage_table(summary: dict[str, Any]) -> Table:
    """The one table of the end screen: a column per stage, a row per figure; the stage's
    counts, then the model on its rows against the oracle, then (live) freshness."""
    table = Table(
        title="demo: each stage, and the model on its rows", title_justify="left", min_width=60
    )
    table.add_column("")
    for name in STAGES:
        table.add_column(name, justify="right")
    columns = {
        name: _stage_rows(summary["stages"].get(name)) + _model_rows(summary.get(name) or {})
        for name in STAGES
    }
    figures = [*_STAGE_FIGURES, *_MODEL_FIGURES]
    for i, figure in enumerate(figures):
        last_of_its_group = i + 1 in (len(_STAGE_FIGURES), len(figures))
        table.add_row(figure, *(columns[n][i] for n in STAGES), end_section=last_of_its_group)
    fresh = summary["freshness"]
    lags = (fresh["produced_to_committed"], fresh["produced_to_trained"], fresh["event_to_trained"])
    for figure, live in zip(_FRESHNESS_FIGURES, lags, strict=True):
        table.add_row(figure, "-", _lags(live))
    return table


def _run_lines(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The figures of the whole run, which belong to no one stage."""
    stall = _fmt(summary.get("data_stall_fraction"), "{:.0%} of the time")
    speed = _fmt(summary.get("samples_per_s"), "{:,.0f} samples/s")
    return [
        ("trainer", f"{summary['trained_rows']:,} rows, {speed}, waiting for data {stall}"),
        ("overall", f"AUC {_fmt(summary.get('auc'), '{:.3f}')}, log loss "
                    f"{_fmt(summary.get('logloss'), '{:.4f}')} (both stages' rows)"),
    ]  # fmt: skip


def legend(width: int | None = None) -> Table:
    """:data:`LEGEND` as two columns: the name, and what it is (wrapped)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(max_width=width)
    for name, meaning in LEGEND:
        grid.add_row(name, meaning)
    return grid


def render(summary: dict[str, Any]) -> RenderableType:
    """The stage table, the run's own figures under it, and the legend."""
    lines = Table.grid(padding=(0, 2))
    lines.add_column(style="bold", no_wrap=True)
    lines.add_column()
    for name, value in _run_lines(summary):
        lines.add_row(name, escape(value))
    return Group(
        stage_table(summary),
        lines,
        Text(""),
        Text("What the figures are", style="bold underline"),
        legend(),
        Text(""),
    )


def show(
    summary: dict[str, Any], console: Console, pointers: Sequence[tuple[str, str]] = ()
) -> None:
    """The end screen: :func:`render`, then ``pointers`` (where things are: MLflow, files,
    insight, the command again), each on one line however long, so that a link or a command
    is copied whole."""
    console.print(render(summary))
    width = max((len(name) for name, _ in pointers), default=0)
    for name, value in pointers:
        console.print(
            f"[bold]{escape(name):<{width}}[/]  {escape(value)}", highlight=False, soft_wrap=True
        )
