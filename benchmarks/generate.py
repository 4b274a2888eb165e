"""How fast the synthetic CTR generator draws and encodes events, without Kafka.

    flow bench generate                         # 120 s of a 2,000 impressions/s stream, history
    flow bench generate --rate 2000 --seconds 300 --users 50000 --items 10000

Real time: ``stream_realtime`` on a simulated clock (a sleep moves it on at once) into a stub
``send``, so the run goes as fast as drawing, P(click), the click heap and JSON encoding allow.
Reported: impressions (and records) per second of CPU and of wall time, and the share of one
core a stream at ``--rate`` takes. Kafka's own cost is not in it. History: ``simulate`` of a
day of impressions (what ``write_history`` does per snapshot, before Iceberg).
Needs no Kafka and no Spark.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from _results import save

from flow.console import console
from flow.workflows.streaming import Realtime, stream_realtime
from flow.workflows.synthetic import SyntheticWorld, simulate

NEEDS_SERVICES = False
NEEDS_SPARK = False
out = console()


class SimulatedClock:
    """Wall time that sleeping moves on at once."""

    def __init__(self, start: datetime) -> None:
        self.now = start.timestamp()

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def bench_realtime(world: SyntheticWorld, rate: float, seconds: float) -> dict[str, Any]:
    users, items = world.users_table(), world.items_table()
    assert world.anchor is not None
    clock = SimulatedClock(world.anchor + timedelta(days=7))
    sent = {"records": 0, "bytes": 0}

    def send(_kind: str, _key: str, payload: bytes) -> None:
        sent["records"] += 1
        sent["bytes"] += len(payload)

    config = Realtime(rate=rate, duration=seconds, malformed_share=0.01, late_arrival_share=0.02)
    wall, cpu = time.perf_counter(), time.process_time()
    report = stream_realtime(
        users, items, send, config, world=world, clock=clock.time, sleep=clock.sleep
    )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "rate": rate,
        "stream_seconds": seconds,
        "impressions": report.impressions,
        "clicks": report.clicks,
        "pending_clicks": report.pending_clicks,
        "bytes_per_record": sent["bytes"] / sent["records"],
        "wall_s": wall,
        "cpu_s": cpu,
        "impressions_per_cpu_s": report.impressions / cpu,
        "records_per_cpu_s": sent["records"] / cpu,
        "impressions_per_wall_s": report.impressions / wall,
        "core_share_at_rate": cpu / seconds,
    }


def bench_history(world: SyntheticWorld, per_day: int) -> dict[str, Any]:
    users, items = world.users_table(), world.items_table()
    assert world.anchor is not None
    cpu = time.process_time()
    events = simulate(
        users,
        items,
        count=per_day,
        start=world.anchor + timedelta(days=3),
        span=timedelta(days=1),
        seed=1,
        world=world,
    )
    cpu = time.process_time() - cpu
    return {"impressions": len(events.impressions), "cpu_s": cpu, "rows_per_cpu_s": per_day / cpu}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=2000.0, help="impressions per second")
    parser.add_argument("--seconds", type=float, default=120.0, help="of stream to generate")
    parser.add_argument("--per-day", type=int, default=200_000, help="history rows to simulate")
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--items", type=int, default=2_000)
    args = parser.parse_args(argv)
    world = SyntheticWorld(
        users=args.users, items=args.items, anchor=datetime(2026, 1, 1, tzinfo=UTC)
    )
    rt = bench_realtime(world, args.rate, args.seconds)
    history = bench_history(world, args.per_day)
    results = {"when": datetime.now(UTC).isoformat(), "realtime": rt, "history": history}
    out.print(
        f"real time: {rt['impressions']:,} impressions + {rt['clicks']:,} clicks "
        f"({rt['stream_seconds']:.0f}s at {rt['rate']:,.0f}/s) in {rt['cpu_s']:.2f}s CPU, "
        f"{rt['wall_s']:.2f}s wall: {rt['impressions_per_cpu_s']:,.0f} impressions/s per core "
        f"({rt['records_per_cpu_s']:,.0f} records/s); at {rt['rate']:,.0f}/s the generator "
        f"takes {rt['core_share_at_rate']:.1%} of a core; {rt['bytes_per_record']:.0f} B/record"
    )
    out.print(
        f"history: {history['impressions']:,} impressions in {history['cpu_s']:.2f}s CPU "
        f"({history['rows_per_cpu_s']:,.0f}/s)"
    )
    path = save("generate", results)
    out.print(f"results: {path}")


if __name__ == "__main__":
    main()
