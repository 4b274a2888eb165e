"""A short job's wall time: ``flow run`` of a 1,000-row pipeline, with and without the driver's
class archive (spark_jobs.cds), measured in turns in the same run.

    flow bench startup                 # 3 runs each way, after the one that makes the archive
    flow bench startup --repeat 5

Loads 1,000 ratings into ``startup.ratings`` (``flow load``'s own code), then runs
``pipelines/ratings.py`` over them with ``FLOW_SPARK_CDS=0`` and ``=1`` in turn (so both see the
same load from the rest of the machine). The first run with the archive on makes the archive
(once per jar set) and is reported apart. Prints each run's seconds, the medians and their
ratio. The stack's services are up first, so their start is not counted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flow.config import StackConfig
from flow.console import console
from flow.workflows.ingest import LoadOptions, load_file
from flow.workflows.timestamps import TimeRules

NEEDS_SPARK = False  # it starts its own jobs: what it measures
out = console()
TABLE = "startup.ratings"
APP = """from flow.pipeline import run_main
from pipelines.ratings import ratings

run_main(ratings({table!r}))
"""


def _ratings(path: Path, rows: int) -> None:
    lines = ["user_id,movie_id,rating,ts"]
    lines += [f"{i % 97},{i % 31},{(2 + i % 9) / 2},{1_600_000_000 + 60 * i}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")


def _run(app: Path, cds: bool) -> float:
    env = {**os.environ, "FLOW_SPARK_CDS": "1" if cds else "0"}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "flow", "run", str(app)], env=env, capture_output=True, text=True
    )
    seconds = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"flow run failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return seconds


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
        first = _run(app, cds=True)  # makes the archive unless an earlier job did
        out.print(f"first run with the archive on (makes it if missing): {first:.1f} s")
        times: dict[bool, list[float]] = {False: [], True: []}
        for n in range(args.repeat):
            for cds in (False, True):
                times[cds].append(_run(app, cds))
                out.print(f"run {n + 1}, archive {'on ' if cds else 'off'}: {times[cds][-1]:.1f} s")
    off, on = statistics.median(times[False]), statistics.median(times[True])
    out.print(
        f"flow run of {args.rows:,} rows, median of {args.repeat}: {off:.1f} s without the "
        f"class archive, {on:.1f} s with it: {on / off:.2f}x the time"
    )


if __name__ == "__main__":
    main()
