"""A streaming query's micro-batches taken apart, from Spark's event log (issue 47's step 1).

    flow submit --connectors kafka --conf spark.eventLog.enabled=true \\
        --conf spark.eventLog.dir=file:///tmp/events --conf spark.eventLog.compress=false \\
        --conf spark.eventLog.rolling.enabled=false APP --continuous --duration 150
    flow bench batch_anatomy /tmp/events/local-1796669131330 --batches 5-26

The stage's own metrics say how a batch's sink time divides between Spark's preparing it and the
writer's checks, job and commit (spark_jobs.live.steps). This goes below them, per batch and then
as medians over the batches asked for: Spark's steps (``durationMs``), the sink's time before
its main job (the longest; the small jobs beside it are the broadcasts of dimension tables and
vocabularies) and after it, the main job's last stage (the stateful operators and the writer
tasks) against the stages before it, task time against the JVM's CPU time (the rest is waiting:
the Python workers, file syncs), and each stateful operator's updates, removals and commit.

Plain Python over the log's JSON lines: no services, no Spark. Results print as a table and go
to $FLOW_HOME/bench/batch_anatomy-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from _results import save

from flow.console import console
from spark_jobs.live.steps import BEFORE_SINK

NEEDS_SERVICES = False  # it reads a file
NEEDS_SPARK = False


@dataclass
class Job:
    started_ms: int
    batch: str | None
    stages: list[int]
    ended_ms: int = 0


@dataclass
class EventLog:
    """What a Spark event log says of jobs, stages, tasks and a streaming query's progress."""

    jobs: list[Job] = field(default_factory=list)
    stages: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Each completed stage's submission and completion (ms since the epoch)."""
    tasks: dict[int, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    """Each stage's tasks: run time and the JVM's CPU time (ms)."""
    progress: list[dict[str, Any]] = field(default_factory=list)


def read_log(path: Path) -> EventLog:
    """The event log at ``path`` (a file, or a folder holding one), uncompressed."""
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if not p.name.startswith((".", "appstatus")))
        if not found:
            raise SystemExit(f"error: no event log in {path}")
        path = found[0]
    log, jobs = EventLog(), {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        events = [json.loads(line) for line in lines if line.strip()]
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SystemExit(
            f"error: {path} is not an uncompressed event log ({exc}); run the job with "
            "--conf spark.eventLog.compress=false, or decompress it first (zstd -d)"
        ) from exc
    for event in events:
        kind = event["Event"]
        if kind == "SparkListenerJobStart":
            properties = event.get("Properties") or {}
            jobs[event["Job ID"]] = Job(
                event["Submission Time"],
                properties.get("streaming.sql.batchId"),
                [s["Stage ID"] for s in event["Stage Infos"]],
            )
        elif kind == "SparkListenerJobEnd" and event["Job ID"] in jobs:
            jobs[event["Job ID"]].ended_ms = event["Completion Time"]
        elif kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            log.stages[info["Stage ID"]] = (info["Submission Time"], info["Completion Time"])
        elif kind == "SparkListenerTaskEnd":
            metrics = event.get("Task Metrics") or {}
            log.tasks[event["Stage ID"]].append(
                (metrics.get("Executor Run Time", 0), metrics.get("Executor CPU Time", 0) / 1e6)
            )
        elif kind.endswith("QueryProgressEvent"):
            log.progress.append(event["progress"])
    log.jobs = list(jobs.values())
    return log


def _epoch_ms(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000


def anatomy(log: EventLog, first: int, last: int) -> dict[str, list[float]]:
    """Per batch from ``first`` to ``last`` (those with a job), each figure in ms."""
    rows: dict[str, list[float]] = defaultdict(list)
    for progress in log.progress:
        batch = progress["batchId"]
        mine = [j for j in log.jobs if j.batch == str(batch) and j.ended_ms]
        if not first <= batch <= last or not mine:
            continue
        steps = progress["durationMs"]
        started = _epoch_ms(progress["timestamp"])
        sink_at = started + sum(steps.get(k, 0) for k in BEFORE_SINK)
        main = max(mine, key=lambda j: j.ended_ms - j.started_ms)
        stages = sorted(s for s in main.stages if s in log.stages)
        tasks = [t for s in stages for t in log.tasks.get(s, [])]
        last_started, last_ended = log.stages[stages[-1]] if stages else (main.started_ms,) * 2
        rows["batch (triggerExecution)"].append(steps.get("triggerExecution", 0))
        for key in BEFORE_SINK:
            rows[f"Spark: {key}"].append(steps.get(key, 0))
        rows["sink: before its main job"].append(main.started_ms - sink_at)
        rows["  small jobs beside it, summed"].append(
            sum(j.ended_ms - j.started_ms for j in mine if j is not main)
        )
        rows["sink: the main job"].append(main.ended_ms - main.started_ms)
        rows["  its stages before the last"].append(last_started - main.started_ms)
        rows["  its last stage"].append(last_ended - last_started)
        rows["  task run time, all its stages"].append(sum(run for run, _ in tasks))
        rows["  of which the JVM's CPU"].append(sum(cpu for _, cpu in tasks))
        rows["sink: after its main job"].append(sink_at + steps.get("addBatch", 0) - main.ended_ms)
        rows["Spark: commitOffsets"].append(steps.get("commitOffsets", 0))
        rows["records read"].append(sum(s.get("numInputRows", 0) for s in progress["sources"]))
        for place, operator in enumerate(progress.get("stateOperators") or []):
            name = f"state {place} {operator['operatorName']}"
            for key in ("allUpdatesTimeMs", "allRemovalsTimeMs", "commitTimeMs"):
                rows[f"{name}: {key}"].append(operator.get(key, 0))
    return dict(rows)


def summary(rows: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Each figure's median, smallest and largest over the batches."""
    return {
        name: {"median": statistics.median(v), "min": min(v), "max": max(v), "batches": len(v)}
        for name, v in rows.items()
    }


def _batches(text: str) -> tuple[int, int]:
    first, _, last = text.partition("-")
    return int(first), int(last or first)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, help="the event log: a file, or its folder")
    parser.add_argument(
        "--batches",
        type=_batches,
        default=(0, 1 << 62),
        help="batch ids FIRST-LAST (default: all); leave out the first batches (warm-up, backlog)",
    )
    args = parser.parse_args(argv)
    first, last = args.batches
    found = summary(anatomy(read_log(args.log), first, last))
    if not found:
        raise SystemExit(f"error: no micro-batch with a job among batches {first}-{last}")
    out = console()
    out.print(f"[bold]micro-batches {first}-{last} of {args.log}[/] (ms: median, min, max)")
    for name, figures in found.items():
        out.print(
            f"  {name:48} {figures['median']:>9,.0f} {figures['min']:>9,.0f} "
            f"{figures['max']:>9,.0f}",
            highlight=False,
        )
    result = {"log": str(args.log), "batches": [first, last], "figures": found}
    out.print(f"  saved {save('batch_anatomy', result)}", highlight=False)
    return result


if __name__ == "__main__":
    main()
