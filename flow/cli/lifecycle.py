"""``flow demo``, ``flow retrain``, ``flow schedule`` and ``flow insight``: models over time."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

import click
from rich.markup import escape

from flow.cli.common import console, emit_json, friendly, out, progress, stack_config
from flow.cli.jobs import spark_launcher
from flow.cli.local import stack_up
from flow.errors import FlowError

__all__ = ["demo", "insight", "retrain", "schedule"]


@click.command()
@click.option("--days", default=3, show_default=True, help="Days of Iceberg history.")
@click.option("--per-day", default=20_000, show_default=True, help="Impressions per day.")
@click.option(
    "--rate", default=1000.0, show_default=True, help="Live impressions per second, in real time."
)
@click.option(
    "--live-seconds", default=240.0, show_default=True, help="Seconds of new live impressions."
)
@click.option(
    "--drain-seconds",
    default=90.0,
    show_default=True,
    help="Seconds more for the clicks still to come (the live stage runs both).",
)
@click.option("--trigger", default="5 seconds", show_default=True, help="Micro-batch interval.")
@click.option("--per-batch", default=20_000, show_default=True, help="Impressions per micro-batch.")
@click.option(
    "--labels",
    type=click.Choice(["immediate", "window"]),
    default="immediate",
    show_default=True,
    help="When the live stage emits an impression: at once (and again with its click), or "
    "once its label window has passed.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="The figures as JSON on stdout (the summary a person reads goes to stderr then).",
)
@friendly
def demo(
    days: int,
    per_day: int,
    rate: float,
    live_seconds: float,
    drain_seconds: float,
    trigger: str,
    per_batch: int,
    labels: Literal["immediate", "window"],
    as_json: bool,
) -> None:
    """The whole product end to end: data, backfill and live stages on a real-time stream, a
    trainer, a summary.

    While it runs, each part's lines are prefixed with its name (services, demo, generator,
    spark, trainer), a line comes at least every 10 s, and every line also goes to a log file
    (known noise only there). At the end, on stdout: one table of the stages and the model on
    their rows, a legend of its figures, and where everything else is. With --json, that goes
    to stderr and the figures as JSON to stdout.
    """
    from flow.insight import run_insight
    from flow.terminal import Terminal, Ticker, elapsed
    from flow.workflows.demo import NAMESPACE, DemoSize, DemoStatus, log_path, run_demo
    from flow.workflows.demo_summary import show, summarize
    from flow.workflows.together import result_file

    started = time.monotonic()
    size = DemoSize(
        days=days,
        per_day=per_day,
        rate=rate,
        live_s=live_seconds,
        drain_s=drain_seconds,
        trigger=trigger,
        per_batch=per_batch,
        labels=labels,
    )
    log = log_path(stack_config())
    with log.open("w") as written:
        terminal = Terminal(console, written)
        status = DemoStatus(stack_config(), NAMESPACE)
        terminal.line("demo", f"every process's output, in full: {log}")
        with Ticker(terminal, status):
            status.phase = "starting the local services"
            stack = stack_up(say=terminal.say_as("services"))
            spark = spark_launcher(
                stack, start=terminal.start_as("spark"), say=terminal.say_as("spark")
            )
            parent = run_demo(
                stack, size, spark, terminal.say_as("demo"), terminal=terminal, status=status
            )
            status.following = False
            status.phase = "reading the figures back from MLflow"
            summary = summarize(stack, parent)
            status.phase = "profiling the training rows (flow insight)"
            insights = run_insight(stack, parent)
    summary["trainer_result"] = str(result_file(stack, parent))
    summary["log"] = str(log)
    pointers = [
        ("MLflow", summary["ui"]),
        ("model", "registered as ctr-demo"),
        ("trainer's result", summary["trainer_result"]),
        ("log", summary["log"]),
    ]
    pointers += [("", f"only in the log: {said}") for said in terminal.noise_said()]
    for made in insights:
        pointers.append((f"insight, {made.name}", made.insight.findings[0]))
        summary[f"insight_{made.name}"] = made.insight.findings
    pointers += [("reproduce", size.command()), ("done in", elapsed(time.monotonic() - started))]
    show(summary, console if as_json else out, pointers)
    if as_json:
        emit_json(summary)


@click.command()
@click.argument("app")
@click.option("--model-name", help="Registered model to retrain (default: the pipeline's name).")
@click.option("--margin", default=0.002, show_default=True, help="AUC a new model may lose.")
@click.option("--holdout-share", default=0.125, show_default=True, help="Buckets held out.")
@click.option("--train", "train_args", default="", help='More trainer options: "--lr 0.01".')
@click.option(
    "--cold",
    is_flag=True,
    help="Start a Spark driver of its own even when a warm one (flow driver start) could run it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON on stdout.")
@friendly
def retrain(
    app: str,
    model_name: str | None,
    margin: float,
    holdout_share: float,
    train_args: str,
    cold: bool,
    as_json: bool,
) -> None:
    """Retrain APP's model on the Iceberg snapshots appended since the last retraining.

    Warm-starts from the registry's champion, evaluates on held-out buckets of the new rows,
    and moves the champion alias only if the new model is not worse by more than --margin.
    Its Spark job runs on the warm driver when one runs (flow driver start) and can take it.

    Exit code: 0 promoted, 3 kept (the champion stays), 4 nothing new, 5 busy (another
    retraining of the pipeline is running), 1 an error.
    """
    from flow.workflows.retrain import (
        EXIT_CODES,
        RetrainSettings,
        load_pipeline,
        services_needed,
    )
    from flow.workflows.retrain import retrain as run_retrain

    pipeline = load_pipeline(app)
    # Only what a retraining uses, and none configured as external is started: a scheduler's
    # worker pointed at remote MLflow must not grow a local broker and tracking server.
    stack = stack_up(services_needed(pipeline))
    name = model_name or pipeline.name
    settings = RetrainSettings(name, margin, holdout_share, train_args, output_to_stderr=as_json)
    # With --json, stdout is the outcome's alone: the Spark job's and the trainer's go to stderr.
    launcher = spark_launcher(stack, warm=not cold, stdout_to_stderr=as_json)
    outcome = run_retrain(stack, app, settings, launcher, progress)
    code = EXIT_CODES[outcome.outcome]
    if as_json:
        click.echo(json.dumps({"model": name, **dataclasses.asdict(outcome), "exit_code": code}))
    else:
        out.print(
            f"retrain {escape(name)}: [bold]{outcome.outcome}[/] ({escape(outcome.reason)}); "
            f"MLflow run {outcome.run_id or '-'}; exit {code}",
            highlight=False,
        )
    raise SystemExit(code)


@click.command()
@click.argument("app")
@click.option("--cron", required=True, help='When to retrain, e.g. "0 3 * * *" (03:00 daily).')
@click.option("--model-name", help="Registered model to retrain (default: the pipeline's name).")
@click.option("--train", "train_args", default="", help="More trainer options.")
@click.option("--max-runs", type=int, help="Stop after this many runs (default: never).")
@friendly
def schedule(
    app: str, cron: str, model_name: str | None, train_args: str, max_runs: int | None
) -> None:
    """Run `flow retrain APP` on a cron schedule, one run at a time, logging each run."""
    from flow.workflows.schedule import Cron, Scheduler

    parsed = Cron.parse(cron)
    stack = stack_config()
    command = [sys.executable, "-m", "flow", "retrain", app, "--train", train_args]
    command += ["--model-name", model_name] if model_name else []
    log = stack.home / "schedule" / f"{Path(app).stem}.jsonl"
    console.print(f"retraining {escape(app)} at {escape(cron)}; runs logged to {escape(str(log))}")

    def job() -> int:
        return subprocess.call(command)

    from flow.workflows.retrain import EXIT_CODES

    outcomes = {code: outcome for outcome, code in EXIT_CODES.items()}
    Scheduler(parsed, job, log, say=progress, outcomes=outcomes).run(max_runs)


@click.command()
@click.argument("run_id", required=False)
@click.option("--location", help="Handoff location: a namespace, path or URI (without RUN_ID).")
@click.option("--channel", help="The channel to profile (without RUN_ID).")
@friendly
def insight(run_id: str | None, location: str | None, channel: str | None) -> None:
    """Training-data insight: per-feature statistics, plots, drift against the previous run.

    With RUN_ID (a trainer's MLflow run, or a pipeline run a trainer nested under), the channels
    and commits that run read; the report goes into its artifacts too.
    """
    from flow.cli.channels import resolve
    from flow.insight import InsightReport, channel_insight, run_insight

    stack = stack_config()
    if run_id:
        found = run_insight(stack, run_id)
    elif location and channel:
        where = resolve(location).uri
        report, folder = channel_insight(stack, where, channel)
        found = [InsightReport(channel, report, folder)]
    else:
        raise FlowError("give a trainer's MLflow RUN_ID, or --location and --channel")
    for made in found:
        out.print(
            f"[bold]{escape(made.name)}[/]: {made.insight.profile.rows:,} rows", highlight=False
        )
        for line in made.insight.findings:
            out.print(f"  - {escape(line)}", highlight=False)
        out.print(f"  report: {escape(str(made.folder / 'report.html'))}", highlight=False)
        if made.artifacts:
            out.print(f"  in MLflow: run {escape(made.artifacts)}", highlight=False)
