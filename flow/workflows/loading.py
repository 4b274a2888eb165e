"""Writing generated CTR data into the stack: Iceberg tables and Kafka topics.

The history records the world it was drawn from (``WORLD_PROPERTY`` on the items table), and a
stream reads it back, so that the stream continues the history's world: the same category
waves and the same items arriving at the same times.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from flow.config import StackConfig
from flow.errors import ConfigError, ServiceError
from flow.stack.iceberg import open_catalog
from flow.stack.kafka import ensure_topics, producer
from flow.workflows.streaming import (
    Realtime,
    StreamPlan,
    StreamReport,
    encode_stream,
    pace,
    stream_realtime,
)
from flow.workflows.synthetic import (
    CATEGORIES,
    CLICKS_SCHEMA,
    COUNTRIES,
    IMPRESSIONS_SCHEMA,
    STATIC,
    WORLD_PROPERTY,
    SyntheticWorld,
    simulate,
)

__all__ = [
    "Dimensions",
    "HistoryReport",
    "StreamReport",
    "dimensions",
    "produce_realtime",
    "produce_stream",
    "topics",
    "update_users",
    "write_history",
]

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


def topics(namespace: str) -> dict[str, str]:
    """The Kafka topic of each event kind."""
    return {"impressions": f"{namespace}.impressions", "clicks": f"{namespace}.clicks"}


def _replace(
    catalog: Catalog, name: str, data: pa.Table, properties: dict[str, str] | None = None
) -> Table:
    if catalog.table_exists(name):
        catalog.drop_table(name)
    table = catalog.create_table(name, schema=data.schema, properties=properties or {})
    table.append(data)
    return table


def _table(catalog: Catalog, name: str, schema: pa.Schema, append: bool) -> Table:
    if catalog.table_exists(name):
        if not append:
            catalog.drop_table(name)
            return catalog.create_table(name, schema=schema)
        table = catalog.load_table(name)
        if set(schema.names) - {f.name for f in table.schema().fields}:
            # History written before a column existed (p_click): add it; old rows read null.
            with table.update_schema() as update:
                update.union_by_name(schema)
        return table
    return catalog.create_table(name, schema=schema)


@dataclass
class HistoryReport:
    """What ``write_history`` wrote."""

    users: int = 0
    items: int = 0
    impressions: int = 0
    clicks: int = 0
    late_clicks: int = 0
    start: datetime | None = None
    end: datetime | None = None
    snapshots: dict[str, int] = field(default_factory=dict)
    world: SyntheticWorld = STATIC
    """The world the history was drawn from (recorded with the items table)."""


def write_history(
    stack: StackConfig,
    world: SyntheticWorld,
    *,
    namespace: str = "ctr",
    days: int = 7,
    per_day: int = 50_000,
    end: datetime | None = None,
    append: bool = False,
    progress: Progress = _quiet,
) -> HistoryReport:
    """Users and items, and ``days`` of impression and click history ending at ``end``.

    Each day is one Iceberg snapshot, so incremental reads see history arrive a day at a time.
    ``append`` adds days to existing history (and keeps the dimensions, and the world recorded
    with them) instead of replacing it. A world without an anchor gets the history's start.
    """
    if days < 1 or per_day < 1:
        raise ConfigError(f"days={days} and per_day={per_day} must both be at least 1")
    catalog = open_catalog(stack.catalog)
    catalog.create_namespace_if_not_exists(namespace)
    report = HistoryReport()
    end = (end or datetime.now(UTC)).replace(minute=0, second=0, microsecond=0)
    world = world.anchored(end - timedelta(days=days))
    users_name, items_name = f"{namespace}.users", f"{namespace}.items"
    if append and catalog.table_exists(users_name) and catalog.table_exists(items_name):
        users = catalog.load_table(users_name).scan().to_arrow()
        items_table = catalog.load_table(items_name)
        items = items_table.scan().to_arrow()
        recorded = items_table.properties.get(WORLD_PROPERTY)
        if recorded:
            world = SyntheticWorld.from_property(recorded)
        else:  # dimensions written before worlds were recorded: record this one from now on
            with items_table.transaction() as tx:
                tx.set_properties({WORLD_PROPERTY: world.to_property()})
    else:
        users, items = world.users_table(), world.items_table()
        _replace(catalog, users_name, users)
        _replace(catalog, items_name, items, {WORLD_PROPERTY: world.to_property()})
        progress(f"dimensions: {len(users):,} users, {len(items):,} items")
    report.users, report.items, report.world = len(users), len(items), world

    imp_table = _table(catalog, f"{namespace}.impressions_history", IMPRESSIONS_SCHEMA, append)
    click_table = _table(catalog, f"{namespace}.clicks_history", CLICKS_SCHEMA, append)
    first_day = len(imp_table.snapshots()) if append else 0
    for day in range(days):
        day_start = end - timedelta(days=days - day)
        events = simulate(
            users,
            items,
            count=per_day,
            start=day_start,
            span=timedelta(days=1),
            seed=world.seed * 100_000 + first_day + day,
            world=world,
            id_prefix=f"h{first_day + day}",
        )
        imp_table.append(events.impressions)
        click_table.append(events.clicks)
        report.impressions += len(events.impressions)
        report.clicks += len(events.clicks)
        report.late_clicks += events.late_clicks
        report.start = report.start or day_start
        progress(
            f"history day {day + 1}/{days}: {per_day:,} impressions, {len(events.clicks):,} clicks"
        )
    report.end = end
    for name, table in (("impressions_history", imp_table), ("clicks_history", click_table)):
        snapshot = table.current_snapshot()
        report.snapshots[name] = snapshot.snapshot_id if snapshot else 0
    return report


@dataclass(frozen=True)
class Dimensions:
    """The users and items a stream draws from, and the world they belong to."""

    users: pa.Table
    items: pa.Table
    world: SyntheticWorld
    recorded: bool
    """Whether the world was recorded with the items table (else: a static stand-in)."""


def dimensions(
    stack: StackConfig, namespace: str = "ctr", world: SyntheticWorld | None = None
) -> Dimensions:
    """The namespace's users and items tables, and the world ``write_history`` recorded with
    them (``world`` overrides it). Items tables written before worlds were recorded get the
    static world their history was drawn from."""
    catalog = open_catalog(stack.catalog)
    try:
        users = catalog.load_table(f"{namespace}.users").scan().to_arrow()
        items_table = catalog.load_table(f"{namespace}.items")
    except Exception as exc:  # pyiceberg raises NoSuchTableError, NoSuchNamespaceError, ...
        raise ConfigError(
            f"no {namespace}.users / {namespace}.items tables to draw events from ({exc}); run "
            "`flow generate history` first"
        ) from exc
    items = items_table.scan().to_arrow()
    recorded = items_table.properties.get(WORLD_PROPERTY)
    if world is None:
        world = SyntheticWorld.from_property(recorded) if recorded else STATIC
    return Dimensions(users, items, world, recorded is not None)


def _stream_dimensions(
    stack: StackConfig, namespace: str, world: SyntheticWorld | None, progress: Progress
) -> Dimensions:
    dims = dimensions(stack, namespace, world)
    if not dims.recorded and world is None:
        progress(
            f"{namespace}.items records no world (written by an older `flow generate history`): "
            "the stream draws from a static world; regenerate the history for drift"
        )
    return dims


class _KafkaSink:
    """Records to the namespace's topics; delivery failures collected, checked at the end."""

    def __init__(self, stack: StackConfig, namespace: str) -> None:
        self.names = topics(namespace)
        ensure_topics(stack.kafka, self.names.values(), partitions=2)
        self.out = producer(stack.kafka)
        self.failures: list[str] = []

    def _delivered(self, err: object, _msg: object) -> None:
        if err is not None:
            self.failures.append(str(err))

    def send(self, kind: str, key: str, payload: bytes) -> None:
        # The Kafka timestamp is the send time, as real producers set it; the event time is in
        # the payload. (Kafka 4 also refuses timestamps more than an hour ahead, which a
        # simulated late click can be.)
        topic = self.names[kind]
        while True:
            try:
                self.out.produce(
                    topic, key=key.encode(), value=payload, on_delivery=self._delivered
                )
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                self.out.poll(0.1)
        self.out.poll(0)

    def close(self) -> None:
        remaining = self.out.flush(60)
        if remaining or self.failures:
            raise ServiceError(
                f"Kafka did not acknowledge {remaining + len(self.failures)} records "
                f"({self.failures[:3]}); check `flow services status`"
            )


def produce_stream(
    stack: StackConfig,
    *,
    namespace: str = "ctr",
    count: int = 10_000,
    rate: float = 0.0,
    malformed_share: float = 0.0,
    start: datetime | None = None,
    span: timedelta | None = None,
    seed: int = 11,
    max_payload_bytes: int = 64 * 1024,
    late_arrival_share: float = 0.02,
    world: SyntheticWorld | None = None,
    progress: Progress = _quiet,
) -> StreamReport:
    """Produce ``count`` impressions (and their clicks) to the namespace's topics, back-dated.

    ``rate``: records per second (0: as fast as Kafka takes them). Event times run from
    ``start`` (default now) over ``span`` (default: what ``rate`` implies, else 10 ms per
    impression), in the world recorded with the history (see ``dimensions``). For events
    stamped as they are sent, with clicks sent when they come due, see ``produce_realtime``.
    """
    if not 0 <= malformed_share < 1:
        raise ConfigError(f"malformed_share={malformed_share} must be in [0, 1)")
    dims = _stream_dimensions(stack, namespace, world, progress)
    start = start or datetime.now(UTC)
    span = span or timedelta(seconds=count / rate if rate > 0 else count * 0.01)
    events = simulate(
        dims.users,
        dims.items,
        count=count,
        start=start,
        span=span,
        seed=seed,
        world=dims.world,
        id_prefix=f"s{seed}",
    )
    sink = _KafkaSink(stack, namespace)
    plan = StreamPlan()
    wait = pace(rate)
    begun = datetime.now(UTC)
    records = encode_stream(
        events,
        malformed_share=malformed_share,
        max_payload_bytes=max_payload_bytes,
        late_arrival_share=late_arrival_share,
        seed=seed,
        plan=plan,
    )
    for sent, (kind, key, payload, _event_time) in enumerate(records, start=1):
        sink.send(kind, key, payload)
        wait(sent)
        if sent % 50_000 == 0:
            progress(f"stream: {sent:,} records sent")
    sink.close()
    return StreamReport(
        impressions=plan.produced["impressions"],
        clicks=plan.produced["clicks"],
        malformed=plan.malformed,
        late_clicks=events.late_clicks,
        late_arrivals=plan.late_arrivals,
        first_ts=plan.first_ts,
        last_ts=plan.last_ts,
        seconds=(datetime.now(UTC) - begun).total_seconds(),
    )


def produce_realtime(
    stack: StackConfig,
    config: Realtime,
    *,
    namespace: str = "ctr",
    world: SyntheticWorld | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    progress: Progress = _quiet,
    stop: Callable[[], bool] = lambda: False,
) -> StreamReport:
    """Impressions at ``config.rate`` per second to the namespace's topics, stamped with the
    time they are sent, and their clicks when they come due (``stream_realtime``), in the
    world recorded with the history. Runs for ``config.duration`` seconds or ``config.count``
    impressions, or until Ctrl-C; clicks not yet due then are reported, not sent."""
    dims = _stream_dimensions(stack, namespace, world, progress)
    sink = _KafkaSink(stack, namespace)
    report = stream_realtime(
        dims.users,
        dims.items,
        sink.send,
        config,
        world=dims.world,
        clock=clock,
        sleep=sleep,
        progress=progress,
        stop=stop,
    )
    sink.close()
    return report


def update_users(
    stack: StackConfig, *, namespace: str = "ctr", share: float = 0.1, seed: int = 13
) -> int:
    """Change the country and favourite category of a ``share`` of users (a new snapshot).

    Returns how many users changed. A running stream's enrichment must see the new values.
    """
    if not 0 < share <= 1:
        raise ConfigError(f"share={share} must be in (0, 1]")
    catalog = open_catalog(stack.catalog)
    table = catalog.load_table(f"{namespace}.users")
    users = table.scan().to_arrow()
    rng = np.random.default_rng([seed, 5])
    changed = rng.random(len(users)) < share
    countries = users.column("country").to_pylist()
    favorites = users.column("favorite_category").to_pylist()
    for k in np.flatnonzero(changed):
        countries[k] = str(rng.choice(COUNTRIES))
        favorites[k] = str(rng.choice(CATEGORIES))
    updated = users.set_column(
        users.schema.get_field_index("country"), "country", pa.array(countries, pa.string())
    ).set_column(
        users.schema.get_field_index("favorite_category"),
        "favorite_category",
        pa.array(favorites, pa.string()),
    )
    table.overwrite(updated)
    return int(changed.sum())
