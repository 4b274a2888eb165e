"""What ``flow bench soak`` reports: its first tenth against its last, the checks, the plot.

Pure functions of the run's samples (benchmarks/soak.py gathers them), so they are tested
without a stage: :func:`attach_polls` gives each micro-batch the follower's looks of its
interval, :func:`summarize` compares the first and the last tenth against the targets, and
:func:`checks` says whether what was produced, committed and read agrees.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

MB = 2**20
TARGETS = {"batch_ms": 1.2, "heap_after_gc_mb": 1.2, "python_rss_mb": 1.2, "idle_poll_ms": 1.5}
"""Issue 43's targets, last tenth / first tenth: batch time within 1.2x; memory flat (within
1.2x, the driver's heap after a collection and its Python process); a follower's idle poll
within 1.5x (the commit log's own target)."""
MAX_REQUESTS_PER_IDLE_POLL = 2
MEASURES: dict[str, tuple[str, float]] = {
    "batch_ms": ("duration_ms", 1.0),
    "heap_after_gc_mb": ("heap_after_gc", 1 / MB),
    "heap_used_mb": ("heap_used", 1 / MB),
    "non_heap_mb": ("non_heap_used", 1 / MB),
    "jvm_rss_mb": ("jvm_rss", 1 / MB),
    "python_rss_mb": ("python_rss", 1 / MB),
    "log_kb": ("log_bytes", 1 / 1024),
    "log_files": ("log_files", 1.0),
    "records": ("records", 1.0),
    "segments": ("segments", 1.0),
    "shards_mb": ("shards_bytes", 1 / MB),
    "spark_checkpoint_mb": ("spark_checkpoint_bytes", 1 / MB),
    "ledger_metadata_mb": ("ledger_metadata_bytes", 1 / MB),
    "idle_poll_ms": ("idle_poll_s", 1000.0),
    "idle_poll_requests": ("idle_poll_requests", 1.0),
    "follower_rss_mb": ("follower_rss", 1 / MB),
}
"""What is compared: a name, the sample's key and the scale to the name's unit."""
POLL_WALL, POLL_SECONDS, POLL_REQUESTS, POLL_IDLE, POLL_RSS = range(5)
"""The follower's fields of a look (benchmarks/_soak_follower.py)."""


def attach_polls(batches: list[dict[str, Any]], polls: Sequence[Sequence[float]]) -> None:
    """Give each sample the follower's idle looks between the sample before it and itself
    (by wall clock): their median time and requests, and the follower's RSS. Samples taken at
    one time (the driver reads several batches' progress at once) share their looks."""
    idle = sorted((p for p in polls if p[POLL_IDLE]), key=lambda p: p[POLL_WALL])
    at, since, found = 0, float("-inf"), None
    for sample in batches:
        now = sample["wall_time"]
        if now > since:
            looks = []
            while at < len(idle) and idle[at][POLL_WALL] <= now:
                looks.append(idle[at])
                at += 1
            found = looks or None
            since = now
        if found:
            sample["idle_poll_s"] = statistics.median(p[POLL_SECONDS] for p in found)
            sample["idle_poll_requests"] = statistics.mean(p[POLL_REQUESTS] for p in found)
            sample["follower_rss"] = found[-1][POLL_RSS]
        else:
            sample["idle_poll_s"] = sample["idle_poll_requests"] = sample["follower_rss"] = None


def _median(rows: Sequence[dict[str, Any]], key: str, scale: float) -> float | None:
    values = [r[key] * scale for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def _slope(rows: Sequence[dict[str, Any]], key: str, scale: float) -> float | None:
    """Growth per 1,000 batches over ``rows`` (least squares), in the measure's unit."""
    points = [(r["index"], r[key] * scale) for r in rows if r.get(key) is not None]
    if len(points) < 3:
        return None
    xs, ys = zip(*points, strict=True)
    return statistics.linear_regression(xs, ys).slope * 1000


def summarize(batches: list[dict[str, Any]], steady: int, fraction: float = 0.1) -> dict[str, Any]:
    """The first and the last ``fraction`` of the first ``steady`` batches (those while the
    stream ran; the stage's catching up after it is left out): each measure's median in both,
    their ratio, its growth per 1,000 batches over the second half, and the targets."""
    run = batches[:steady]
    k = max(1, round(len(run) * fraction))
    first, last, later = run[:k], run[-k:], run[len(run) // 2 :]
    summary: dict[str, Any] = {"batches": len(run), "window": k, "measures": {}}
    for name, (key, scale) in MEASURES.items():
        a, b = _median(first, key, scale), _median(last, key, scale)
        summary["measures"][name] = {
            "first": a,
            "last": b,
            "ratio": b / a if a and b is not None else None,
            "growth_per_1000": _slope(later, key, scale),
        }
    measures = summary["measures"]
    targets: dict[str, Any] = {}
    for name, limit in TARGETS.items():
        ratio = measures[name]["ratio"]
        targets[name] = {
            "limit": limit,
            "ratio": ratio,
            "met": ratio is not None and ratio <= limit,
        }
    requests = [m for m in (measures["idle_poll_requests"]["first"],
                            measures["idle_poll_requests"]["last"]) if m is not None]  # fmt: skip
    targets["idle_poll_requests"] = {
        "limit": MAX_REQUESTS_PER_IDLE_POLL,
        "ratio": max(requests) if requests else None,
        "met": bool(requests) and max(requests) <= MAX_REQUESTS_PER_IDLE_POLL,
    }
    summary["targets"] = targets
    return summary


def checks(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Whatever the timing: each produced impression reached the follower once (and at most
    once more as a positive), the counts agree from Kafka to the stage to the channel to the
    reader, and the log was compacted. Each check: ``ok`` and what it compared."""
    stream, stage, read = result["stream"], result["stage"], result["follower"]
    log = result["checkpoint"]
    valid = stream["valid_impressions"]
    once = {"1": valid} if valid else {}
    found: dict[str, dict[str, Any]] = {}

    def check(name: str, ok: bool, detail: str) -> None:
        found[name] = {"ok": bool(ok), "detail": detail}

    check(
        "every impression once",
        read["negatives"] == once
        and read["largest_number"] < stream["impressions"]
        and len(read["prefixes"]) <= 1,
        f"{valid:,} valid impressions produced; the follower's ids by times seen: "
        f"{read['negatives']}, largest {read['largest_number']:,}, prefixes {read['prefixes']}",
    )
    positives = read["positives"].get("1", 0)
    check(
        "positives at most once, after their impression",
        set(read["positives"]) <= {"1"}
        and read["positives_without_negative"] == 0
        and positives == stage["positives"],
        f"follower {read['positives']} ({read['positives_without_negative']} without their "
        f"impression), the stage's {stage['positives']:,}",
    )
    rows = {
        "stage": stage["training_rows"],
        "channel": log["committed_rows"],
        "follower": read["rows"],
    }
    check(
        "counts reconcile",
        stage["reconciled"]
        and result["caught_up"] is True
        and stage["events_input"] == stream["impressions"]
        and stage["events_dead"] == stream["malformed"]
        and stage["labels_input"] == stream["clicks"]
        and stage["duplicates"] == 0
        and len(set(rows.values())) == 1,
        f"produced {stream['impressions']:,} impressions ({stream['malformed']:,} malformed) and "
        f"{stream['clicks']:,} clicks; the stage read {stage['events_input']:,} and "
        f"{stage['labels_input']:,}, dead {stage['events_dead']:,}, duplicates "
        f"{stage['duplicates']:,}, reconciled {stage['reconciled']}, caught up "
        f"{result['caught_up']}; training rows {rows}",
    )
    check(
        "log compacted",
        log["exists"]
        and log["retired_upto"] >= 0
        and log["retired_not_folded"] == 0
        and log["retired_records_left"] == 0
        and log["retired_shard_folders_left"] == 0,
        f"checkpoint {log['exists']}: {log['folded']:,} of {log['commits']:,} commits folded in "
        f"{log['segments']} segments, retired up to batch {log['retired_upto']:,} "
        f"({log['retired_not_folded']} of those not folded, {log['retired_records_left']} "
        f"records and {log['retired_shard_folders_left']} shard folders left); "
        f"{log['records_left']:,} records in commits/",
    )
    return found


def show(result: dict[str, Any], out: Console) -> None:
    summary, config = result["summary"], result["config"]
    k, n = summary["window"], summary["batches"]
    per_batch = result["seconds"] / max(1, len(result["batches"]))
    out.print(
        f"[bold]soak: {n:,} micro-batches ({result['seconds'] / 60:,.1f} min, "
        f"{per_batch:.2f} s a batch), {config['rate']:g} impressions/s, trigger "
        f"{config['trigger']}[/]; first {k:,} batches against the last {k:,} (medians)"
    )
    out.print(f"  reproduce: {result['command']}", highlight=False, soft_wrap=True)
    out.print(f"  {'':24} {'first':>10} {'last':>10} {'last/first':>10} {'/1000 batches':>13}")
    targets = summary["targets"]
    for name, m in summary["measures"].items():
        target = targets.get(name)
        verdict = ""
        if target is not None:
            verdict = f"  target <= {target['limit']}x: {'met' if target['met'] else 'MISSED'}"
        out.print(
            f"  {name:24} {_num(m['first']):>10} {_num(m['last']):>10} "
            f"{_num(m['ratio'], 'x'):>10} {_num(m['growth_per_1000'], signed=True):>13}{verdict}",
            highlight=False,
        )
    requests = targets["idle_poll_requests"]
    out.print(
        f"  requests per idle poll: at most {_num(requests['ratio'])} (target <= "
        f"{requests['limit']}: {'met' if requests['met'] else 'MISSED'})",
        highlight=False,
    )
    for name, check in result["checks"].items():
        mark = "ok" if check["ok"] else "FAILED"
        out.print(f"  check {name}: {mark} ({check['detail']})", highlight=False, soft_wrap=True)


def _num(value: float | None, suffix: str = "", signed: bool = False) -> str:
    if value is None:
        return "n/a"
    sign = "+" if signed else ""
    if abs(value) >= 100:
        return f"{value:{sign},.0f}{suffix}"
    return f"{value:{sign}.2f}{suffix}"


def plot(result: dict[str, Any], where: Path) -> Path:
    """Batch time, memory, the log on disk and the follower's idle poll, over the batches."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = result["batches"]
    index = [b["index"] for b in batches]

    def series(key: str, scale: float = 1.0) -> tuple[list[int], list[float]]:
        kept = [(b["index"], b[key] * scale) for b in batches if b.get(key) is not None]
        return [i for i, _ in kept], [v for _, v in kept]

    figure, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True)
    time_axis, memory, disk, poll = axes.flat
    time_axis.plot(index, [b["duration_ms"] for b in batches], ",", alpha=0.4)
    time_axis.plot(index, _rolling_median([b["duration_ms"] for b in batches]), linewidth=1.2)
    time_axis.set_ylabel("batch duration (ms)")
    time_axis.set_yscale("log")
    for key, label in (("heap_after_gc", "JVM heap after GC"), ("jvm_rss", "JVM RSS"),
                       ("python_rss", "driver Python RSS")):  # fmt: skip
        memory.plot(*series(key, 1 / MB), marker="." if key == "heap_after_gc" else None,
                    label=label)  # fmt: skip
    memory.set_ylabel("MB")
    memory.legend(loc="upper left", fontsize=8)
    disk.plot(*series("log_bytes", 1 / 1024), label="channel log (KB)")
    disk.plot(*series("log_files"), label="channel log files")
    disk.plot(*series("ledger_metadata_bytes", 1 / 1024), label="dead-letter table metadata (KB)")
    disk.set_yscale("log")
    disk.set_xlabel("micro-batch")
    disk.legend(loc="upper left", fontsize=8)
    poll.plot(*series("idle_poll_s", 1000), label="follower's idle poll (ms)")
    poll.plot(*series("idle_poll_requests"), label="requests per idle poll")
    poll.set_xlabel("micro-batch")
    poll.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    figure.savefig(where, dpi=110)
    plt.close(figure)
    return where


def _rolling_median(values: Sequence[float], width: int = 51) -> list[float]:
    half = width // 2
    return [statistics.median(values[max(0, i - half) : i + half + 1]) for i in range(len(values))]
