"""``flow generate``: synthetic CTR data in Iceberg and Kafka, and a Criteo-format file."""

from __future__ import annotations

import time
from pathlib import Path

import click

from flow.cli.common import console, friendly, progress, stack_config

__all__ = ["generate"]


@click.group()
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
    "--drift",
    default=0.7,
    show_default=True,
    help="Amplitude (logit) of the waves in each category's appeal; 0: it never changes.",
)
@click.option(
    "--new-items",
    default=0.3,
    show_default=True,
    help="Share of items introduced over 14 days from the history's start; 0: none.",
)
@click.option(
    "--interactions",
    default=0.0,
    show_default=True,
    help="Scale of the click model's device x category and age x price effects, which no "
    "additive model fits (see SyntheticWorld.interactions); 0: none.",
)
@click.option(
    "--append", is_flag=True, help="Add days to existing history instead of replacing it."
)
@friendly
def generate_history(
    namespace: str,
    days: int,
    per_day: int,
    users: int,
    items: int,
    seed: int,
    drift: float,
    new_items: float,
    interactions: float,
    append: bool,
) -> None:
    """Users, items and impression/click history in Iceberg (replaced unless --append).

    The world drifts (see --drift, --new-items) and is recorded with the items table, so a
    later `flow generate stream` continues it; every impression carries p_click, the
    probability its click was drawn from. --append keeps the recorded world.
    """
    from flow.workflows.loading import write_history
    from flow.workflows.synthetic import SyntheticWorld

    stack = stack_config()
    started = time.monotonic()
    world = SyntheticWorld(
        seed=seed,
        users=users,
        items=items,
        drift=drift,
        new_items=new_items,
        interactions=interactions,
    )
    report = write_history(
        stack,
        world,
        namespace=namespace,
        days=days,
        per_day=per_day,
        append=append,
        progress=progress,
    )
    anchor = report.world.anchor
    console.print(
        f"{report.impressions:,} impressions, {report.clicks:,} clicks ({report.late_clicks:,} "
        f"after the 30-minute window), {report.users:,} users, {report.items:,} items in "
        f"{namespace}.* ({time.monotonic() - started:.1f}s); world: drift {report.world.drift}, "
        f"{report.world.new_items:.0%} of items arriving over {report.world.arrival_days:g} days"
        + (f" from {anchor:%Y-%m-%d %H:%M}" if anchor else "")
        + f", interactions {report.world.interactions:g}"
    )


@generate.command("stream")
@_namespace
@click.option(
    "--realtime",
    is_flag=True,
    help="Live: impressions stamped when sent, each click sent when it comes due.",
)
@click.option(
    "--rate",
    type=float,
    help="Back-dated: records per second (default 0: as fast as possible). --realtime: "
    "impressions per second (default 2000), their clicks on top.",
)
@click.option(
    "--count",
    type=int,
    help="Impressions to send (default 10000; --realtime: no limit, see --duration).",
)
@click.option(
    "--duration",
    type=float,
    help="--realtime: seconds to run (default: until --count, or Ctrl-C).",
)
@click.option(
    "--malformed", default=0.01, show_default=True, help="Share of impressions sent broken."
)
@click.option(
    "--span-minutes",
    type=float,
    help="Back-dated: event time the impressions cover (default: count/rate, or 10 ms each).",
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
    realtime: bool,
    rate: float | None,
    count: int | None,
    duration: float | None,
    malformed: float,
    span_minutes: float | None,
    late_arrivals: float,
    seed: int,
) -> None:
    """Impressions and clicks to Kafka, drawn from the Iceberg users and items, in the world
    the history recorded.

    Back-dated (default): --count impressions with event times over --span-minutes, sent in
    event-time order. --realtime: a live source, e.g. `--realtime --rate 2000 --duration 300`;
    clicks still to come when it stops are reported, not sent.
    """
    from datetime import timedelta

    from flow.workflows.loading import produce_realtime, produce_stream, topics
    from flow.workflows.streaming import Realtime

    stack = stack_config()
    if realtime:
        if span_minutes is not None:
            raise click.UsageError("--span-minutes is for back-dated streams; drop --realtime")
        config = Realtime(
            rate=2000.0 if rate is None else rate,
            duration=duration,
            count=count,
            malformed_share=malformed,
            late_arrival_share=late_arrivals,
            seed=seed,
        )
        console.print(
            f"sending {config.rate:,.0f} impressions/s to {namespace}.impressions and their "
            f"clicks to {namespace}.clicks "
            + (f"for {duration:,.0f}s" if duration else "until Ctrl-C")
            + (f" or {count:,} impressions" if count else "")
        )
        report = produce_realtime(stack, config, namespace=namespace, progress=progress)
    else:
        if duration is not None:
            raise click.UsageError("--duration is for --realtime streams; use --count")
        report = produce_stream(
            stack,
            namespace=namespace,
            count=10_000 if count is None else count,
            rate=rate or 0.0,
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
    if realtime:
        console.print(
            f"clicks not yet due (not sent): {report.pending_clicks:,}; most behind schedule: "
            f"{report.max_lag_s:.2f}s"
        )
    console.print(report.delay_summary())


@generate.command("update-users")
@_namespace
@click.option("--share", default=0.1, show_default=True, help="Share of users to change.")
@click.option("--seed", default=13, show_default=True)
@friendly
def generate_update_users(namespace: str, share: float, seed: int) -> None:
    """Change some users' country and favourite category (a new Iceberg snapshot)."""
    from flow.workflows.loading import update_users

    changed = update_users(stack_config(), namespace=namespace, share=share, seed=seed)
    console.print(f"changed {changed:,} users in {namespace}.users")


@generate.command("criteo")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--rows", default=100_000, show_default=True)
@click.option("--missing", default=0.1, show_default=True, help="Share of each feature left empty.")
@click.option("--seed", default=3, show_default=True)
@friendly
def generate_criteo(file: Path, rows: int, missing: float, seed: int) -> None:
    """A Criteo display-ads format file (tab separated; gzip if FILE ends in .gz) whose clicks
    follow a known model, for trying `flow import criteo` without the real data."""
    from flow.workflows.criteo import write_criteo_sample

    sample = write_criteo_sample(file, rows, seed=seed, missing=missing)
    console.print(
        f"{sample.rows:,} rows, {sample.clicks:,} clicks ({sample.clicks / sample.rows:.1%}) "
        f"in {file}"
    )
