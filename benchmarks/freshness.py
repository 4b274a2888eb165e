"""Freshness end to end: a paced real-time stream through the live stage into a trainer.

    flow bench freshness                                  # 2,000 impressions/s for 900 s
    flow bench freshness --seconds 180                    # the first minutes only
    flow bench freshness --rate 500 --seconds 120 --trigger "5 seconds"
    flow bench freshness --labels window                  # the window strategy, for contrast
    flow bench freshness --rate 1000 --master spark://127.0.0.1:7077 \
        --conf spark.driver.host=127.0.0.1 --conf spark.driver.bindAddress=127.0.0.1
                                                          # the Spark job on a cluster

The demo's workflow (flow/workflows/demo.py) at a benchmark's size, in its own namespace: a
drifting synthetic history into Iceberg, the backfill, then the live stage running for
``--seconds`` on a stream produced in real time (impressions stamped as they are sent, clicks
sent when they come due), with a DLRM trainer following the live channel. Reported, against the
targets of issue 17:

* produced -> committed (the live channel's rows against their commit times) and produced ->
  trained (the trainer's clock when it trained on each row), p50 and p99, and by leg: the
  stage's (waiting, planning, jobs and commit) and the trainer's, measured (committed -> picked
  up, picked up -> trained: :func:`legs_of`);
* the live stage's lag: Kafka offsets behind the latest per micro-batch, and batch durations;
* the positive rate and calibration of the live rows trained on (corrected for immediate
  labels), and the model's AUC beside the oracle's on the same rows.

Rows produced while the backfill ran wait in Kafka until the live stage starts, so the stream
starts when the backfill is done. Results go to $FLOW_HOME/bench/freshness-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _results import save

from flow.config import StackConfig
from flow.console import console
from flow.handoff import Channel
from flow.insight.freshness import BatchTimes, channel_freshness, lag_quantiles
from flow.storage import namespace_locations
from flow.workflows.demo import DemoSize, run_demo
from flow.workflows.demo_summary import summarize
from spark_jobs.joins import POSITIVES
from spark_jobs.live.plan import POSITIVES_KEY
from spark_jobs.live.steps import STEPS

NEEDS_SPARK = False  # it submits its own Spark job, as `flow run` does
NAMESPACE = "freshness"
out = console()


def _child_run(stack: StackConfig, parent: str, name: str) -> tuple[Any, str] | None:
    """An MLflow client and the id of the run ``name`` nested under ``parent`` (None: none)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=stack.mlflow.tracking_uri)
    experiment = client.get_run(parent).info.experiment_id
    runs = client.search_runs(
        [experiment],
        filter_string=f"tags.mlflow.parentRunId = '{parent}' and attributes.run_name = '{name}'",
    )
    return (client, runs[0].info.run_id) if runs else None


def _stage_lag(stack: StackConfig, parent: str) -> dict[str, float]:
    """The live stage's per-batch Kafka lag and durations, from its MLflow run."""
    found_run = _child_run(stack, parent, "live")
    if found_run is None:
        return {}
    client, run = found_run
    found: dict[str, float] = {}
    for metric, name in (("kafka_lag_max", "offsets_behind"), ("batch_duration_ms", "batch_ms")):
        values = [m.value for m in client.get_metric_history(run, metric)]
        if values:
            found[f"{name}_median"] = statistics.median(values)
            found[f"{name}_max"] = max(values)
        if name == "batch_ms":
            found["batches"] = float(len(values))
    return found


def _batch_times(stack: StackConfig, parent: str) -> dict[int, BatchTimes]:
    """Each live micro-batch's start and planning time, by batch id, from the stage's run."""
    found_run = _child_run(stack, parent, "live")
    if found_run is None:
        return {}
    client, run = found_run
    started = {m.step: m.value for m in client.get_metric_history(run, "batch_started_s")}
    planning = {m.step: m.value for m in client.get_metric_history(run, "batch_planning_ms")}
    steps: dict[int, dict[str, float]] = {}
    for name in STEPS:
        for m in client.get_metric_history(run, f"batch_{name}_ms"):
            steps.setdefault(m.step, {})[name] = m.value / 1000
    return {
        step: BatchTimes(
            started_s=at, planning_s=planning.get(step, 0.0) / 1000, steps=steps.get(step, {})
        )
        for step, at in started.items()
    }


def breakdown(stack: StackConfig, parent: str, summary: dict[str, Any]) -> dict[str, Any]:
    """Where an impression's seconds go, produced -> trained, by leg (issue 47's step 1): see
    :func:`legs_of`, fed the live channel, the stage's batch times and the trainer's legs."""
    handoff = namespace_locations(stack, NAMESPACE).handoff.uri
    if not Channel(handoff, "live").exists():
        return {}
    found = channel_freshness(handoff, "live", batches=_batch_times(stack, parent))
    logged = _artifact(stack, parent, "freshness_legs.json")
    return legs_of(
        found.legs,
        found.produced_to_committed,
        summary["freshness"]["produced_to_trained"],
        logged.get("live") if isinstance(logged, dict) else None,
    )


def legs_of(
    stage: dict[str, dict[str, float]],
    committed: dict[str, float],
    trained: dict[str, float | None],
    trainer: dict[str, list[list[float]]] | None,
) -> dict[str, Any]:
    """The legs, quantiles in seconds. The ``stage``'s, per row from the live channel and the
    stage's batch times: waiting for the batch that reads it, its planning, its jobs and commit.

    The ``trainer``'s, measured (its run's ``freshness_legs.json`` for the channel): committed
    -> picked up per commit (the poll that listed it), each counted once per row;
    picked up -> trained and window ready -> trained per training batch (trainers.result).
    ``committed_to_trained`` stays beside them: produced -> trained's quantile less produced ->
    committed's (a difference of quantiles, not a leg: at p99 it can come out negative)."""
    legs: dict[str, Any] = dict(stage)
    if trainer:
        commits = trainer.get("commits") or []
        waited = np.repeat([c[2] for c in commits], [int(c[1]) for c in commits])
        batches = np.asarray(trainer.get("batches") or [], dtype=np.float64).reshape(-1, 2)
        for name, values in (
            ("committed_to_picked_up", waited),
            ("picked_up_to_trained", batches[:, 0]),
            ("ready_to_trained", batches[:, 1]),
        ):
            if len(values):
                legs[name] = lag_quantiles(values)
    difference = {}
    for q in ("p50", "p99"):
        value = trained.get(q)
        if value is not None and q in committed:
            difference[q] = value - committed[q]
    legs["committed_to_trained"] = difference
    return legs


def _artifact(stack: StackConfig, parent: str, name: str) -> Any:
    """A JSON file the trainer's run logged (None: no such run or file)."""
    found_run = _child_run(stack, parent, "train")
    if found_run is None:
        return None
    client, run = found_run
    with tempfile.TemporaryDirectory() as folder:
        try:
            path = client.download_artifacts(run, name, folder)
        except Exception:  # an older trainer logged none
            return None
        return json.loads(Path(path).read_text())


def _series(stack: StackConfig, parent: str) -> list[list[float]]:
    """The trainer's live batches in order: [seconds since its first live batch, produced ->
    trained seconds] (its run's ``freshness_produced.json``)."""
    logged = _artifact(stack, parent, "freshness_produced.json")
    series: list[list[float]] = logged.get("live", []) if isinstance(logged, dict) else []
    return series


def _plot(series: list[list[float]], where: Path) -> Path | None:
    """produced -> trained of each live batch over the run, as a PNG beside the results."""
    if not series:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 3.2))
    axes.plot([t for t, _ in series], [lag for _, lag in series], marker=".", linewidth=0.8)
    axes.axhline(30, color="grey", linestyle="--", linewidth=0.8, label="target p99 30 s")
    axes.set_xlabel("seconds since the trainer's first live batch")
    axes.set_ylabel("produced -> trained (s)")
    axes.legend(loc="upper right")
    figure.tight_layout()
    figure.savefig(where, dpi=110)
    plt.close(figure)
    return where


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=2000.0, help="impressions per second")
    # 900 s: a continuous trainer's first minute, while no click of the live impressions has
    # come yet, is most of a 3-minute run's live rows
    # (docs/experiments/2026-11-23-freshness-and-demo.md).
    parser.add_argument("--seconds", type=float, default=900.0, help="seconds of impressions")
    parser.add_argument(
        "--drain", type=float, default=120.0, help="seconds more for the clicks still to come"
    )
    # 0 s: issue 47's design (a batch starts when the last one ends; a wait for the trigger is
    # no leg of its own).
    parser.add_argument("--trigger", default="0 seconds", help="micro-batch interval")
    parser.add_argument("--per-batch", type=int, default=100_000, help="impressions per batch")
    parser.add_argument("--labels", choices=("immediate", "window"), default="immediate")
    parser.add_argument("--days", type=int, default=1, help="days of history for the backfill")
    parser.add_argument("--per-day", type=int, default=50_000)
    parser.add_argument("--batch-size", type=int, default=4096, help="the trainer's batch")
    parser.add_argument(
        "--full-batches",
        action="store_true",
        help="the trainer waits for full batches across commits (before whole commits)",
    )
    parser.add_argument(
        "--positives",
        choices=POSITIVES,
        default="processor",
        help="the immediate strategy's operator for its positives (processor: the project's "
        "transformWithState one; join: Spark's stream-stream join, before issue 47)",
    )
    parser.add_argument(
        "--master", help="run the Spark job on this master (spark://..., yarn, k8s://...)"
    )
    parser.add_argument(
        "--conf", action="append", default=[], metavar="K=V", help="spark-submit settings"
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help=f"first run the design before issue 47 ({BEFORE['trigger']} trigger, full "
        "batches, the stream-stream join), then this one, and print both breakdowns",
    )
    args = parser.parse_args(argv)

    from flow.cli.local import stack_up

    stack = stack_up()
    chosen = {
        "trigger": args.trigger,
        "full_batches": args.full_batches,
        "positives": args.positives,
    }
    designs = {"before": BEFORE, "chosen": chosen} if args.compare else {"chosen": chosen}
    runs = {name: _run(stack, args, design) for name, design in designs.items()}
    summary = runs["chosen"]
    if args.compare:
        summary["before"] = runs["before"]
        out.print("[bold]before and after, produced -> trained by leg[/] (seconds, p50 / p99)")
        for line in compared(runs["before"], summary):
            out.print(line, highlight=False)
    path = save("freshness", summary, folder=stack.home / "bench", indent=1)
    plot = _plot(summary["produced_to_trained_series"], path.with_suffix(".png"))
    out.print(f"results: {path}" + (f", plot: {plot}" if plot else ""))


BEFORE: dict[str, Any] = {"trigger": "10 seconds", "full_batches": True, "positives": "join"}
"""The design ``--compare`` measures first: a 10 s trigger, a trainer that waited for full
batches across commits, and the positives from Spark's stream-stream join (``flow bench
freshness`` before issue 47)."""


def _run(stack: StackConfig, args: argparse.Namespace, design: dict[str, Any]) -> dict[str, Any]:
    """One run of the demo's workflow at the bench's size with ``design`` (a trigger, full
    batches or not, the positives' operator: :data:`BEFORE`'s keys), and its figures."""
    from flow.cli.jobs import spark_launcher

    size = DemoSize(
        days=args.days,
        per_day=args.per_day,
        rate=args.rate,
        live_s=args.seconds,
        drain_s=args.drain,
        trigger=design["trigger"],
        per_batch=args.per_batch,
        labels=args.labels,
        batch_size=args.batch_size,
        full_batches=design["full_batches"],
    )
    started = time.monotonic()

    def say(line: str) -> None:
        out.print(f"  {time.monotonic() - started:6.0f}s {line}", highlight=False)

    launch = spark_launcher(stack)
    options = ["--master", args.master] if args.master else []
    options += [item for conf in args.conf for item in ("--conf", conf)]
    if design["positives"] != "processor":  # (the processor: the stage's own choice)
        options += ["--conf", f"{POSITIVES_KEY}={design['positives']}"]

    def spark(app: Sequence[str], env: dict[str, str]) -> int:
        return launch([*options, *app], env)

    parent = run_demo(stack, size, spark, say, namespace=NAMESPACE)
    summary = summarize(stack, parent, namespace=NAMESPACE)
    summary["stage_lag"] = _stage_lag(stack, parent)
    summary["breakdown"] = breakdown(stack, parent, summary)
    summary["args"] = vars(args) | design
    summary["args"].pop("compare", None)
    series = _series(stack, parent)
    summary["produced_to_trained_series"] = series
    summary["after_the_first_minute"] = settled(series)
    _show(summary)
    slowest = sorted(series, key=lambda point: -point[1])[:5]
    if slowest:
        said = ", ".join(f"{lag:.1f} s at {at:.0f} s" for at, lag in slowest)
        out.print(f"  slowest live batches (produced -> trained, when): {said}", highlight=False)
    return summary


SETTLED_AFTER_S = 60.0
"""Where :func:`settled` starts: the live stage starts behind the stream (the rows produced
while its driver started and its first batch ran), and catches up within the first minute."""


def settled(series: Sequence[Sequence[float]], after: float = SETTLED_AFTER_S) -> dict[str, float]:
    """p50 / p99 of produced -> trained over the trainer's live batches from ``after`` seconds
    on (each batch one value, as :func:`_series` gives them): the stage running, without its
    start-up's catch-up, shown beside the whole run's quantiles, not instead of them."""
    lags = [lag for at, lag in series if at >= after]
    if not lags:
        return {}
    return {"p50": float(np.percentile(lags, 50)), "p99": float(np.percentile(lags, 99))}


def compared(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Two runs' breakdowns side by side, leg by leg, and produced -> trained."""

    def legs(run: dict[str, Any]) -> dict[str, Any]:
        produced = run.get("freshness", {}).get("produced_to_trained")
        return {**(run.get("breakdown") or {}), "produced_to_trained": produced or {}}

    def q(legs: dict[str, Any], name: str) -> str:
        found = legs.get(name) or {}
        return " / ".join(
            f"{found[k]:.1f}" if found.get(k) is not None else "n/a" for k in ("p50", "p99")
        )

    first, then = legs(before), legs(after)
    lines = [f"    {'':50} {'before':>13} {'after':>13}"]
    for name, label in (*LEGS, ("produced_to_trained", "produced -> trained")):
        if name in first or name in then:
            lines.append(f"    {label:50} {q(first, name):>13} {q(then, name):>13}")
    return lines


def _show(summary: dict[str, Any]) -> None:
    fresh, live, lag = summary["freshness"], summary["live"], summary["stage_lag"]

    def q(lags: dict[str, float | None]) -> str:
        p50, p99 = lags.get("p50"), lags.get("p99")
        return " / ".join(f"{v:.1f}" if v is not None else "n/a" for v in (p50, p99))

    rows = [
        ("produced -> committed, p50 / p99 (s)", q(fresh["produced_to_committed"])),
        ("produced -> trained, p50 / p99 (s)", q(fresh["produced_to_trained"])),
        ("event -> trained, p50 / p99 (s)", q(fresh["event_to_trained"])),
        ("produced -> trained from 60 s on, by trainer batch",
         q(summary.get("after_the_first_minute") or {})),
        ("live stage: batches, median / max batch (ms)",
         f"{lag.get('batches', 0):.0f}, {lag.get('batch_ms_median', 0):,.0f} / "
         f"{lag.get('batch_ms_max', 0):,.0f}"),
        ("live stage: Kafka offsets behind, median / max",
         f"{lag.get('offsets_behind_median', 0):,.0f} / {lag.get('offsets_behind_max', 0):,.0f}"),
        ("live rows: positive rate (corrected) / true rate",
         f"{_pct(live.get('positive_rate'))} / {_pct(live.get('true_rate'))}"),
        ("live rows: calibration (corrected)", _num(live.get("calibration"))),
        ("live rows: AUC / frozen after backfill / oracle",
         f"{_num(live.get('auc'))} / {_num(live.get('frozen_auc'))} / "
         f"{_num(live.get('oracle_auc'))}"),
    ]  # fmt: skip
    out.print(f"[bold]freshness, {summary['args']['rate']:g} impressions/s, "
              f"{summary['args']['labels']} labels[/]")  # fmt: skip
    out.print(f"  reproduce: {_command(summary['args'])}", highlight=False, soft_wrap=True)
    for label, value in rows:
        out.print(f"  {label:48} {value}", highlight=False)
    for line in leg_lines(summary.get("breakdown") or {}):
        out.print(line, highlight=False)


LEGS = (
    ("waiting", "waiting for the micro-batch that reads it"),
    ("planning", "the batch's planning (offsets, plan, WAL)"),
    ("jobs_and_commit", "the batch's jobs and the commit"),
    ("step_prepare", "  of which Spark's preparing it (physical plan)"),
    ("step_checks", "  of which the writer's checks (dims, room)"),
    ("step_job", "  of which its job (broadcasts, stages)"),
    ("step_commit", "  of which the commit (counts, ledger, channel)"),
    ("committed_to_picked_up", "committed -> picked up (poll, listing)"),
    ("picked_up_to_trained", "picked up -> trained (read, window, step)"),
    ("ready_to_trained", "  of which window ready -> trained (queue, step)"),
    ("committed_to_trained", "committed -> trained, p - p*"),
)
"""The breakdown's legs, in order (``*``: a difference of quantiles, see legs_of)."""


def leg_lines(legs: dict[str, dict[str, float]]) -> list[str]:
    """The breakdown as lines for the terminal (none without legs)."""
    if not legs:
        return []
    lines = ["  [bold]produced -> trained by leg[/] (seconds, p50 / p99)"]
    for name, label in LEGS:
        if name in legs:
            p50, p99 = legs[name].get("p50"), legs[name].get("p99")
            said = " / ".join(f"{v:.1f}" if v is not None else "n/a" for v in (p50, p99))
            lines.append(f"    {label:50} {said}")
    if "committed_to_trained" in legs:
        lines.append("    * a difference of quantiles (produced -> trained less -> committed)")
    return lines


def _command(args: dict[str, Any]) -> str:
    """The ``flow bench freshness`` command line with every setting this run used."""
    line = ["flow", "bench", "freshness"]
    for name, value in args.items():
        if name in ("master", "conf"):
            continue
        if isinstance(value, bool):  # a switch
            line += [f"--{name.replace('_', '-')}"] if value else []
            continue
        line += [
            f"--{name.replace('_', '-')}",
            f"{value:g}" if isinstance(value, float) else str(value),
        ]
    if args.get("master"):
        line += ["--master", args["master"]]
    for conf in args.get("conf") or []:
        line += ["--conf", conf]
    return shlex.join(line)


def _pct(value: float | None) -> str:
    return f"{value:.2%}" if value is not None else "n/a"


def _num(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "n/a"


if __name__ == "__main__":
    main()
