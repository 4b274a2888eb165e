"""``flow services``, ``flow ui`` and ``flow jars``: the local stack and its JVM artifacts."""

from __future__ import annotations

import json
import time
import webbrowser
from collections.abc import Callable, Sequence
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from flow.cli.common import console, friendly, progress, stack_config
from flow.config import StackConfig
from flow.errors import FlowError
from flow.tracking.experiments import experiments_url

__all__ = ["jars", "services", "stack_up", "ui"]


def status_table(rows: Sequence[Any]) -> Table:
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


@click.group()
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
    from flow import stack as svc

    stack = stack_config()
    console.print(f"[bold]Local stack[/] in {escape(str(stack.home))}")
    started = time.monotonic()
    rows = svc.up(stack, only, progress=progress)
    console.print(status_table(rows))
    console.print(f"up in {time.monotonic() - started:.1f}s")
    if not all(r.healthy for r in rows):
        raise SystemExit(1)


@services.command("down")
@_only
@friendly
def services_down(only: tuple[str, ...]) -> None:
    """Stop the managed services and every process they started (and the warm driver)."""
    from flow import stack as svc
    from flow.workflows.warm import stop_driver

    stack = stack_config()
    if not only and (stopped := stop_driver(stack.home)) is not None:
        console.print(f"stopped the warm driver (pid {stopped.pid})")
    console.print(status_table(svc.down(stack, only)))


@services.command("status")
@_only
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@friendly
def services_status(only: tuple[str, ...], as_json: bool) -> None:
    """Show each service as it is now; exit 1 if any is dead or not answering."""
    from flow import stack as svc

    rows = svc.status(stack_config(), only)
    if as_json:
        click.echo(json.dumps([r.__dict__ for r in rows], indent=2))
    else:
        console.print(status_table(rows))
    if any(r.state in ("dead", "unresponsive") for r in rows):
        raise SystemExit(1)


@click.command()
@click.option("--open", "open_browser", is_flag=True, help="Also open it in a web browser.")
@friendly
def ui(open_browser: bool) -> None:
    """Start the MLflow server of the local stack if needed and print the UI's address."""
    from flow import stack as svc

    stack = stack_config()
    (row,) = svc.up(stack, ("mlflow",), progress=progress)
    if not row.healthy:
        raise FlowError(f"the MLflow UI is not available: {row.state} {row.detail}")
    # The experiments list in "Model training" mode: MLflow 3 otherwise opens on GenAI pages.
    address = experiments_url(stack.mlflow.tracking_uri)
    click.echo(f"MLflow UI: {address}")
    if open_browser:
        webbrowser.open(address)


@click.group()
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
    from flow.stack import jars as jarmod

    stack = stack_config()
    names = profiles or ("spark", "kafka")
    with console.status(f"resolving the {', '.join(names)} jars from {stack.maven_repo} ..."):
        results = jarmod.resolve_all(names, stack, verify=verify, progress=progress)
    for resolved, seconds in results:
        size = sum(p.stat().st_size for p in resolved.jars) / 1e6
        console.print(
            f"{resolved.profile}: {len(resolved.jars)} jars, {size:.0f} MB in "
            f"{escape(str(resolved.folder))} ({seconds:.1f}s)"
        )
    if "spark" in names:  # Spark's jobs take the project's own operators too: compiled now
        from flow.stack.project_jar import project_jar

        started = time.monotonic()
        with console.status("compiling Primus Flow's Spark operators ..."):
            own = project_jar(stack.jar_cache, jarmod.pyspark_jars_dir())
        console.print(
            f"operators: {escape(str(own))} ({time.monotonic() - started:.1f}s; "
            "built once per source, pyspark and JDK)"
        )


@jars.command("list")
@click.argument("profile", default="spark")
@friendly
def jars_list(profile: str) -> None:
    """Print the jar paths of PROFILE, one per line."""
    from flow.stack import jars as jarmod

    for jar in jarmod.resolve(profile, stack_config()).jars:
        click.echo(str(jar))


def stack_up(only: tuple[str, ...] = (), say: Callable[[str], None] = progress) -> StackConfig:
    """The local stack, brought up (``only`` those services; default all), saying so through
    ``say``; a FlowError naming the services that are not healthy. Services configured as
    external are checked, never started."""
    from flow import stack as svc

    stack = stack_config()
    rows = svc.up(stack, only, progress=say)
    unhealthy = [r for r in rows if not r.healthy]
    if unhealthy:
        console.print(status_table(rows))
        raise FlowError(f"the local stack is not healthy: {', '.join(r.name for r in unhealthy)}")
    return stack
