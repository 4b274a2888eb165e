"""``flow driver start | stop | status``: a warm Spark driver for ``flow run``
(:mod:`flow.workflows.warm`)."""

from __future__ import annotations

import dataclasses
import time

import click
from rich.markup import escape

from flow.cli.common import console, friendly, progress, stack_config
from flow.cli.local import stack_up

__all__ = ["driver"]


@click.group()
def driver() -> None:
    """A warm Spark driver that `flow run` hands its jobs to (a short job then takes seconds,
    not a driver's start). Jobs go to it only when nothing would differ: same FLOW_* settings
    and master, the connectors they need, flow's code unchanged, no spark-submit options."""


def _say(text: str) -> None:
    console.print(f"[dim]{escape(text)}[/]", highlight=False, soft_wrap=True)


@driver.command("start")
@click.option(
    "--connectors",
    metavar="LIST",
    default="all",
    show_default=True,
    help="Connectors beside Iceberg on its classpath: all, none, or a comma list of "
    "kafka,delta (a job that needs one it lacks starts its own driver).",
)
@click.option("--master", default=None, help="Its master (default: FLOW_SPARK_MASTER, local[*]).")
@click.option(
    "--idle-minutes",
    type=float,
    default=60.0,
    show_default=True,
    help="It stops after this long without a job (its memory is the stack's otherwise).",
)
@friendly
def driver_start(connectors: str, master: str | None, idle_minutes: float) -> None:
    """Start the warm driver (the services too, if they are down)."""
    from flow.engine import load_engine, parse_connectors
    from flow.workflows.warm import describe, find_driver, start_driver

    chosen = parse_connectors(connectors)
    stack = stack_up()
    running = find_driver(stack.home)
    if running is not None:
        _say(f"a warm driver is running already ({describe(running)}); flow driver stop first")
        return
    engine = load_engine("spark")
    argv = [*(["--master", master] if master else []), str(engine.warm_driver_app())]
    argv += ["--idle-minutes", str(idle_minutes)]
    launch = engine.submit_command(argv, stack, chosen)
    if launch.on_exit:
        # The archive a first driver writes is moved into place when its launcher sees it end;
        # nothing waits for this one: it maps an archive if one exists, and makes none.
        launch = engine.submit_command(
            argv, dataclasses.replace(stack, spark=dataclasses.replace(stack.spark, cds=False)),
            chosen,
        )  # fmt: skip
    started = time.monotonic()
    state = start_driver(stack.home, launch, progress)
    console.print(
        f"warm driver up in {time.monotonic() - started:.1f} s ({escape(describe(state))}); "
        "`flow run APP.py` uses it, `flow driver stop` ends it",
        highlight=False,
        soft_wrap=True,
    )


@driver.command("stop")
@friendly
def driver_stop() -> None:
    """Stop the warm driver (a job it runs is cancelled)."""
    from flow.workflows.warm import stop_driver

    stopped = stop_driver(stack_config().home)
    console.print("no warm driver was running" if stopped is None else f"stopped pid {stopped.pid}")


@driver.command("status")
@friendly
def driver_status() -> None:
    """Whether a warm driver runs, and whether `flow run` can use it; exit 1 when none runs."""
    from flow.workflows.warm import describe, find_driver

    stack = stack_config()
    state = find_driver(stack.home)
    if state is None:
        console.print("no warm driver (flow driver start)")
        raise SystemExit(1)
    console.print(f"warm driver: {escape(describe(state))}", highlight=False, soft_wrap=True)
    why = state.refusal(stack, stack.spark.master, frozenset())
    if why is not None:
        console.print(f"[yellow]flow run will not use it:[/] {escape(why)}", highlight=False)
