"""``flow``: the command line of Primus Flow.

    flow services up | down | status     the embedded local stack
    flow ui                              the MLflow UI of the local stack
    flow jars fetch | list               JVM artifacts in the project-local cache
    flow submit [spark-submit options] APP.py [args]
    flow demo                            the whole product end to end on the local stack
    flow insight RUN_ID                  training-data statistics, plots and drift of a run
    flow retrain APP.py                  incremental retraining, promoted only if not worse
    flow schedule APP.py --cron "..."    retraining on a schedule, one run at a time
    flow run APP.py [args]               services up, then submit on the local stack
    flow spark-args                      the options to give a plain spark-submit
    flow handoff ls | show | verify | close | retire | drop
                                         handoff channels (see flow/handoff_cli.py)
    flow bench NAME [args]               benchmarks/NAME.py on the local stack

Heavy imports (pyiceberg, MLflow, Kafka clients) happen inside the commands that need them, so
``flow --help`` stays instant.
"""

from __future__ import annotations

import ast
import json
import os
import shlex
import subprocess
import sys
import time
import webbrowser
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from flow.cli_support import console, friendly, progress, stack_config
from flow.config import StackConfig
from flow.errors import FlowError
from flow.handoff_cli import handoff

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="primus-flow")
def main() -> None:
    """Primus Flow: Kafka + Iceberg + Spark into PyTorch trainers, tracked in MLflow."""


main.add_command(handoff)


# -- services -------------------------------------------------------------------------------


def _status_table(rows: Sequence[Any]) -> Table:
    table = Table(show_header=True, header_style="bold")
    for column in ("service", "state", "address", "pid", "detail"):
        table.add_column(column)
    colours = {"running": "green", "ready": "green", "external": "cyan", "stopped": "yellow"}
    for row in rows:
        colour = colours.get(row.state, "red")
        table.add_row(
            row.name,
            f"[{colour}]{row.state}[/]",
            escape(row.address),
            str(row.pid or ""),
            escape(row.detail),
        )
    return table


@main.group()
def services() -> None:
    """Start, stop and inspect the local stack (Kafka, Iceberg catalog, MLflow)."""


_only = click.option(
    "--only",
    multiple=True,
    type=click.Choice(["kafka", "iceberg", "mlflow"]),
    help="Act on this service only (repeatable).",
)


@services.command("up")
@_only
@friendly
def services_up(only: tuple[str, ...]) -> None:
    """Start every service that is not running (harmless when all are)."""
    from flow import services as svc

    stack = stack_config()
    console.print(f"[bold]Local stack[/] in {escape(str(stack.home))}")
    started = time.monotonic()
    rows = svc.up(stack, only, progress=progress)
    console.print(_status_table(rows))
    console.print(f"up in {time.monotonic() - started:.1f}s")
    if not all(r.healthy for r in rows):
        raise SystemExit(1)


@services.command("down")
@_only
@friendly
def services_down(only: tuple[str, ...]) -> None:
    """Stop the managed services and every process they started."""
    from flow import services as svc

    console.print(_status_table(svc.down(stack_config(), only)))


@services.command("status")
@_only
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@friendly
def services_status(only: tuple[str, ...], as_json: bool) -> None:
    """Show each service as it is now; exit 1 if any is dead or not answering."""
    from flow import services as svc

    rows = svc.status(stack_config(), only)
    if as_json:
        click.echo(json.dumps([r.__dict__ for r in rows], indent=2))
    else:
        console.print(_status_table(rows))
    if any(r.state in ("dead", "unresponsive") for r in rows):
        raise SystemExit(1)


@main.command()
@click.option("--open", "open_browser", is_flag=True, help="Also open it in a web browser.")
@friendly
def ui(open_browser: bool) -> None:
    """Start the MLflow server of the local stack if needed and print the UI's address."""
    from flow import services as svc

    stack = stack_config()
    (row,) = svc.up(stack, ("mlflow",), progress=progress)
    if not row.healthy:
        raise FlowError(f"the MLflow UI is not available: {row.state} {row.detail}")
    click.echo(f"MLflow UI: {stack.mlflow.tracking_uri}")
    if open_browser:
        webbrowser.open(stack.mlflow.tracking_uri)


# -- jars -----------------------------------------------------------------------------------


@main.group()
def jars() -> None:
    """JVM artifacts, resolved from Maven Central into the project-local cache."""


@jars.command("fetch")
@click.option(
    "--profile",
    "profiles",
    multiple=True,
    help="Profile to resolve (repeatable; default: spark and kafka).",
)
@click.option("--verify", is_flag=True, help="Re-check every cached jar's SHA-256.")
@friendly
def jars_fetch(profiles: tuple[str, ...], verify: bool) -> None:
    """Resolve the pinned jars once; later runs reuse them without the network."""
    from flow import jars as jarmod

    stack = stack_config()
    for name in profiles or ("spark", "kafka"):
        started = time.monotonic()
        with console.status(f"resolving the {name} jars from {stack.maven_repo} ..."):
            resolved = jarmod.resolve(name, stack, verify=verify, progress=progress)
        size = sum(p.stat().st_size for p in resolved.jars) / 1e6
        console.print(
            f"{name}: {len(resolved.jars)} jars, {size:.0f} MB in {escape(str(resolved.folder))} "
            f"({time.monotonic() - started:.1f}s)"
        )


@jars.command("list")
@click.argument("profile", default="spark")
@friendly
def jars_list(profile: str) -> None:
    """Print the jar paths of PROFILE, one per line."""
    from flow import jars as jarmod

    for jar in jarmod.resolve(profile, stack_config()).jars:
        click.echo(str(jar))


# -- synthetic data -------------------------------------------------------------------------


@main.group()
def generate() -> None:
    """Synthetic CTR data: Iceberg history and dimensions, a Kafka event stream."""


_namespace = click.option(
    "--namespace", default="ctr", show_default=True, help="Iceberg namespace / topic prefix."
)


@generate.command("history")
@_namespace
@click.option("--days", default=7, show_default=True, help="Days of history (one snapshot each).")
@click.option("--per-day", default=50_000, show_default=True, help="Impressions per day.")
@click.option("--users", default=10_000, show_default=True)
@click.option("--items", default=2_000, show_default=True)
@click.option("--seed", default=7, show_default=True)
@click.option(
    "--append", is_flag=True, help="Add days to existing history instead of replacing it."
)
@friendly
def generate_history(
    namespace: str, days: int, per_day: int, users: int, items: int, seed: int, append: bool
) -> None:
    """Users, items and impression/click history in Iceberg (replaced unless --append)."""
    from flow.datagen.ctr import World
    from flow.datagen.load import write_history

    stack = stack_config()
    started = time.monotonic()
    report = write_history(
        stack,
        World(seed=seed, users=users, items=items),
        namespace=namespace,
        days=days,
        per_day=per_day,
        append=append,
        progress=progress,
    )
    console.print(
        f"{report.impressions:,} impressions, {report.clicks:,} clicks ({report.late_clicks:,} "
        f"after the 30-minute window), {report.users:,} users, {report.items:,} items in "
        f"{namespace}.* ({time.monotonic() - started:.1f}s)"
    )


@generate.command("stream")
@_namespace
@click.option("--count", default=10_000, show_default=True, help="Impressions to send.")
@click.option(
    "--rate", default=0.0, show_default=True, help="Records per second (0: as fast as possible)."
)
@click.option(
    "--malformed", default=0.01, show_default=True, help="Share of impressions sent broken."
)
@click.option(
    "--span-minutes",
    type=float,
    help="Event time the impressions cover (default: count/rate, or 10 ms each).",
)
@click.option(
    "--late-arrivals",
    default=0.02,
    show_default=True,
    help="Share of records sent up to 3 minutes out of event-time order.",
)
@click.option("--seed", default=11, show_default=True)
@friendly
def generate_stream(
    namespace: str,
    count: int,
    rate: float,
    malformed: float,
    span_minutes: float | None,
    late_arrivals: float,
    seed: int,
) -> None:
    """Impressions and clicks to Kafka, drawn from the Iceberg users and items."""
    from datetime import timedelta

    from flow.datagen.load import produce_stream, topics

    stack = stack_config()
    report = produce_stream(
        stack,
        namespace=namespace,
        count=count,
        rate=rate,
        malformed_share=malformed,
        span=timedelta(minutes=span_minutes) if span_minutes else None,
        late_arrival_share=late_arrivals,
        seed=seed,
        progress=progress,
    )
    broken = ", ".join(f"{k} {v}" for k, v in sorted(report.malformed.items())) or "none"
    console.print(
        f"sent {report.impressions:,} impressions and {report.clicks:,} clicks to "
        f"{', '.join(topics(namespace).values())} in {report.seconds:.1f}s; malformed: {broken}; "
        f"clicks after the window: {report.late_clicks:,}; sent out of order: "
        f"{report.late_arrivals:,}"
    )


@generate.command("update-users")
@_namespace
@click.option("--share", default=0.1, show_default=True, help="Share of users to change.")
@click.option("--seed", default=13, show_default=True)
@friendly
def generate_update_users(namespace: str, share: float, seed: int) -> None:
    """Change some users' country and favourite category (a new Iceberg snapshot)."""
    from flow.datagen.load import update_users

    changed = update_users(stack_config(), namespace=namespace, share=share, seed=seed)
    console.print(f"changed {changed:,} users in {namespace}.users")


# -- Spark jobs -----------------------------------------------------------------------------

_passthrough = {"ignore_unknown_options": True, "allow_interspersed_args": False}


def _abbreviated(argv: Sequence[str]) -> str:
    """The command line with long jar lists shortened to a count, for the terminal."""
    shown = [f"<{a.count(',') + 1} jars>" if a.count(",") > 3 and ".jar" in a else a for a in argv]
    return shlex.join(shown)


def _launch(argv: Sequence[str], stack: StackConfig, extra: dict[str, str] | None = None) -> int:
    from flow.engine import load_engine

    launch = load_engine("spark").submit_command(list(argv), stack)
    console.print(f"[dim]$ {escape(_abbreviated(launch.argv))}[/]", highlight=False, soft_wrap=True)
    return subprocess.call(launch.argv, env={**os.environ, **launch.env, **(extra or {})})


def _stack_up() -> StackConfig:
    """The local stack, brought up; a FlowError naming the services that are not healthy."""
    from flow import services as svc

    stack = stack_config()
    rows = svc.up(stack, progress=progress)
    unhealthy = [r for r in rows if not r.healthy]
    if unhealthy:
        console.print(_status_table(rows))
        raise FlowError(f"the local stack is not healthy: {', '.join(r.name for r in unhealthy)}")
    return stack


def _spark_launcher(stack: StackConfig) -> Callable[[Sequence[str], dict[str, str]], int]:
    """``_launch`` on ``stack``, for the commands that start Spark jobs of their own."""

    def spark(argv: Sequence[str], extra: dict[str, str]) -> int:
        return _launch(argv, stack, extra)

    return spark


@main.command(context_settings=_passthrough)
@click.argument("argv", nargs=-1, type=click.UNPROCESSED, required=True)
@friendly
def submit(argv: tuple[str, ...]) -> None:
    """spark-submit APP with the stack's jars, catalogs and Kafka settings.

    Options before APP go to spark-submit and win over the stack's (--master, --conf k=v, ...);
    arguments after APP go to the application.
    """
    raise SystemExit(_launch(argv, stack_config()))


@main.command(context_settings=_passthrough)
@click.option(
    "--train",
    "train_args",
    metavar="ARGS",
    help='Also run a trainer following the job\'s channels: "--channel live --model dlrm ...".',
)
@click.option("--train-procs", default=1, show_default=True, help="Trainer processes (ranks).")
@click.argument("argv", nargs=-1, type=click.UNPROCESSED, required=True)
@friendly
def run(argv: tuple[str, ...], train_args: str | None, train_procs: int) -> None:
    """Bring the local stack up, then submit APP on it (like `flow submit`).

    With --train, a trainer (torchrun -m trainers train --follow ARGS) runs beside the job and
    both nest under one MLflow run; the trainer ends after the job, once it has read everything.
    """
    stack = _stack_up()
    if train_args is None:
        raise SystemExit(_launch(argv, stack))
    from flow.together import run_together

    run_together(argv, train_args, train_procs, stack, _spark_launcher(stack), progress)


@main.command()
@click.option("--days", default=3, show_default=True, help="Days of Iceberg history.")
@click.option("--per-day", default=20_000, show_default=True, help="Impressions per day.")
@click.option("--live", default=20_000, show_default=True, help="Impressions in the Kafka stream.")
@click.option("--per-batch", default=5_000, show_default=True, help="Impressions per micro-batch.")
@click.option("--json", "as_json", is_flag=True, help="Also print the summary as JSON.")
@friendly
def demo(days: int, per_day: int, live: int, per_batch: int, as_json: bool) -> None:
    """The whole product end to end: data, backfill and live stages, a trainer, a summary."""
    from flow.demo import DemoSize, run_demo, show, summarize

    started = time.monotonic()
    stack = _stack_up()
    size = DemoSize(days=days, per_day=per_day, live=live, per_batch=per_batch)
    parent = run_demo(stack, size, _spark_launcher(stack), progress)
    summary = summarize(stack, parent)
    show(summary, console)
    from flow.insight import run_insight

    for name, report in run_insight(stack, parent):
        console.print(f"  insight, {escape(name)}: {escape(report.findings[0])}", highlight=False)
        summary[f"insight_{name}"] = report.findings
    console.print(f"done in {time.monotonic() - started:.0f}s")
    if as_json:
        click.echo(json.dumps(summary))


@main.command()
@click.argument("app")
@click.option("--model-name", help="Registered model to retrain (default: the pipeline's name).")
@click.option("--margin", default=0.002, show_default=True, help="AUC a new model may lose.")
@click.option("--holdout-share", default=0.125, show_default=True, help="Buckets held out.")
@click.option("--train", "train_args", default="", help='More trainer options: "--lr 0.01".')
@friendly
def retrain(
    app: str, model_name: str | None, margin: float, holdout_share: float, train_args: str
) -> None:
    """Retrain APP's model on the Iceberg snapshots appended since the last retraining.

    Warm-starts from the registry's champion, evaluates on held-out buckets of the new rows,
    and moves the champion alias only if the new model is not worse by more than --margin.
    """
    from flow.retrain import RetrainSettings, load_pipeline
    from flow.retrain import retrain as run_retrain

    stack = _stack_up()
    name = model_name or load_pipeline(app).name
    settings = RetrainSettings(name, margin, holdout_share, train_args)
    outcome = run_retrain(stack, app, settings, _spark_launcher(stack), progress)
    console.print(f"retrain {escape(name)}: [bold]{outcome.outcome}[/] ({escape(outcome.reason)})")


@main.command()
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
    from flow.schedule import Cron, Scheduler

    parsed = Cron.parse(cron)
    stack = stack_config()
    command = [sys.executable, "-m", "flow.cli", "retrain", app, "--train", train_args]
    command += ["--model-name", model_name] if model_name else []
    log = stack.home / "schedule" / f"{Path(app).stem}.jsonl"
    console.print(f"retraining {escape(app)} at {escape(cron)}; runs logged to {escape(str(log))}")

    def job() -> int:
        return subprocess.call(command)

    Scheduler(parsed, job, log, say=progress).run(max_runs)


@main.command()
@click.argument("run_id", required=False)
@click.option("--location", help="Handoff location: a namespace, path or URI (without RUN_ID).")
@click.option("--channel", help="The channel to profile (without RUN_ID).")
@friendly
def insight(run_id: str | None, location: str | None, channel: str | None) -> None:
    """Training-data insight: per-feature statistics, plots, drift against the previous run.

    With RUN_ID (a trainer's MLflow run, or a pipeline run a trainer nested under), the channels
    and commits that run read; the report goes into its artifacts too.
    """
    from flow.handoff_cli import resolve
    from flow.insight import channel_insight, run_insight

    stack = stack_config()
    if run_id:
        found = run_insight(stack, run_id)
    elif location and channel:
        where = resolve(location).uri
        report, folder = channel_insight(stack, where, channel)
        found = [(channel, report)]
        console.print(f"report: {escape(str(folder / 'report.html'))}")
    else:
        raise FlowError("give a trainer's MLflow RUN_ID, or --location and --channel")
    for name, report in found:
        console.print(f"[bold]{escape(name)}[/]: {report.profile.rows:,} rows", highlight=False)
        for line in report.findings:
            console.print(f"  - {escape(line)}", highlight=False)


@main.command(context_settings=_passthrough)
@click.argument("name")
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
@friendly
def bench(name: str, argv: tuple[str, ...]) -> None:
    """Run benchmarks/NAME.py on the local stack (arguments after NAME go to the benchmark)."""
    script = Path("benchmarks") / f"{name}.py"
    if not script.exists():
        found = sorted(p.stem for p in Path("benchmarks").glob("*.py"))
        raise FlowError(
            f"no benchmark {name!r} in {Path('benchmarks').resolve()}; benchmarks: "
            f"{', '.join(found) or 'none (run from the project folder)'}"
        )
    # A benchmark that needs no Kafka or MLflow says so: on two cores, idle services still
    # take a share of the CPU it measures. One that needs no Spark runs as plain Python, so
    # it runs where there is no Java (a bare GPU machine).
    stack = _stack_up() if _flag(script, "NEEDS_SERVICES") else stack_config()
    if not _flag(script, "NEEDS_SPARK"):
        raise SystemExit(subprocess.call([sys.executable, str(script), *argv]))
    raise SystemExit(_launch(["--driver-memory", "4g", str(script), *argv], stack))


def _flag(script: Path, name: str) -> bool:
    """False when the benchmark sets ``NAME = False`` at module level; True otherwise."""
    for node in ast.parse(script.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            and isinstance(node.value, ast.Constant)
        ):
            return bool(node.value.value)
    return True


@main.command("spark-args")
@friendly
def spark_args() -> None:
    """Print the spark-submit options that give a job the stack (for a plain spark-submit)."""
    from flow.engine import load_engine

    click.echo(
        " ".join(shlex.quote(o) for o in load_engine("spark").submit_options(stack_config()))
    )


if __name__ == "__main__":  # pragma: no cover - `python -m flow.cli`
    sys.exit(main())
