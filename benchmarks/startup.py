"""A short job's wall time: ``flow run`` of a 1,000-row pipeline with every connector's jars
and no driver class archive (spark_jobs.cds), with every jar and the archive, with the
pipeline's own jars (Iceberg's: no Kafka, no Delta) and the archive, and on a warm driver
(``flow driver start``), measured in turns.

    flow bench startup                 # 3 runs each way, after those that make the archives
    flow bench startup --repeat 5

Loads 1,000 ratings into ``startup.ratings`` (``flow load``'s own code), then runs
``pipelines/ratings.py`` over them: ``flow run --connectors all`` with ``FLOW_SPARK_CDS=0`` and
``=1``, and ``flow run`` (connectors from the pipeline) with ``=1``, in turn (so all see the same
load from the rest of the machine). The first run of each jar set with the archive on makes its
archive (once per jar set) and is reported apart. The warm driver is started once after those
(its start reported apart) and stopped at the end; the other ways run with ``--cold`` beside
it. Prints each run's wall seconds and the CPU
seconds of its processes (flow, spark-submit's JVM, Python: less swayed by other work on the
machine than the wall time), and the medians; they go to $FLOW_HOME/bench/startup-<time>.json.
The stack's services are up first, so their start is not counted.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _results import save

from flow.config import StackConfig
from flow.console import console
from flow.storage import location
from flow.workflows.ingest import LoadOptions, load_file
from flow.workflows.timestamps import TimeRules

NEEDS_SPARK = False  # it starts its own jobs: what it measures
out = console()
TABLE = "startup.ratings"
APP = """from flow.pipeline import run_main
from pipelines.ratings import ratings


def startup_app():
    return ratings({table!r})


if __name__ == "__main__":
    run_main(startup_app())
"""
WAYS = {
    "every jar, no archive": (False, "all", False),
    "every jar, archive": (True, "all", False),
    "the pipeline's jars, archive": (True, None, False),
    "warm driver (flow driver start)": (True, None, True),
}
"""Each way: the class archive on, ``--connectors`` (None: the pipeline's), the warm driver."""


def _ratings(path: Path, rows: int) -> None:
    lines = ["user_id,movie_id,rating,ts"]
    lines += [f"{i % 97},{i % 31},{(2 + i % 9) / 2},{1_600_000_000 + 60 * i}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _flow(args: list[str], env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "flow", *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
    )
    said = done.stdout + done.stderr
    if done.returncode:
        raise SystemExit(f"flow {' '.join(args)} failed:\n{said[-4000:]}")
    return said


def _run(app: Path, cds: bool, connectors: str | None, warm: bool) -> tuple[float, float]:
    """A run's wall seconds and its processes' CPU seconds (less swayed by a busy machine; a
    warm driver's CPU is not counted: it is not a child of this process). Each run writes
    its channel anew (one left by the run before would make it a replay that writes nothing)."""
    stack = StackConfig.from_env()
    location(stack.handoff, stack.s3).child(TABLE.split(".")[0]).remove()
    given = [] if connectors is None else ["--connectors", connectors]
    cpu = _cpu()
    started = time.perf_counter()
    said = _flow(
        ["run", *([] if warm else ["--cold"]), *given, str(app)],
        {"FLOW_SPARK_CDS": "1" if cds else "0"},
    )
    seconds = time.perf_counter() - started
    if warm != ("on the warm driver" in said):
        raise SystemExit(f"flow run {'did not run' if warm else 'ran'} on the warm driver:\n{said}")
    return seconds, _cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rows", type=int, default=1000)
    args = parser.parse_args()
    stack = StackConfig.from_env()
    with tempfile.TemporaryDirectory() as folder:
        csv = Path(folder) / "ratings.csv"
        _ratings(csv, args.rows)
        options = LoadOptions(
            table=TABLE,
            timestamp_columns=("ts",),
            time=TimeRules(epoch_unit="s"),
            label="rating>=4",
            mode="replace",
        )
        with load_file(stack, csv, options) as load:
            load.write()
        app = Path(folder) / "startup_app.py"
        app.write_text(APP.format(table=TABLE))
        firsts: dict[str, float] = {}
        for name, (cds, connectors, warm) in WAYS.items():
            if cds and not warm:  # makes the archive of this jar set unless an earlier job did
                firsts[name], _ = _run(app, cds, connectors, warm)
                out.print(f"first run, {name} (makes it if missing): {firsts[name]:.1f} s")
        _flow(["driver", "stop"])
        started = time.perf_counter()
        _flow(["driver", "start"])
        driver_start = time.perf_counter() - started
        out.print(f"flow driver start (once): {driver_start:.1f} s")
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in WAYS}
        try:
            for n in range(args.repeat):
                for name, (cds, connectors, warm) in WAYS.items():
                    wall, cpu = _run(app, cds, connectors, warm)
                    times[name].append((wall, cpu))
                    out.print(f"run {n + 1}, {name}: {wall:.1f} s, CPU {cpu:.1f} s")
        finally:
            _flow(["driver", "stop"])
    first_way = times[next(iter(WAYS))]
    base = statistics.median(w for w, _ in first_way)
    base_cpu = statistics.median(c for _, c in first_way)
    out.print(f"flow run of {args.rows:,} rows, median of {args.repeat}:")
    ways: dict[str, dict[str, Any]] = {}
    for name, runs in times.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        out.print(
            f"  {name}: {wall:.1f} s ({wall / base:.2f}x), CPU {cpu:.1f} s ({cpu / base_cpu:.2f}x)"
        )
        ways[name] = {
            "wall_s": wall,
            "cpu_s": cpu,
            "runs": [{"wall_s": w, "cpu_s": c} for w, c in runs],
        }
    results = {
        "rows": args.rows,
        "repeat": args.repeat,
        "first_run_s": firsts,
        "driver_start_s": driver_start,
        "ways": ways,
    }
    out.print(f"results: {save('startup', results)}")


if __name__ == "__main__":
    main()
