"""Training throughput while the MLflow server hangs, against the same training while it answers.

    flow bench tracking_outage                      # CPU: a small DLRM, 3 runs of 2,010 steps
    flow bench tracking_outage --log-every 10 --window 20

Starts a private MLflow server (its own folder and port, so nothing else talks to it), writes a
small Criteo-shaped channel and trains a small DLRM, logging every step (``--log-every``). After
a first window of ``--window`` steps to warm up, the server is hung and answering in turn, a
window each: its processes stopped (SIGSTOP), so its port takes connections that nothing
answers and a request runs to the client's timeout, then resumed. Windows in turn, a fraction of
a second each, see the same load from the rest of the machine, which a run with the server up
and a run with it down, a minute apart, do not. Prints samples/s in each kind of window per run
and over all runs; the tracker's queue should keep the hung ones within 10 % of the others.
Results go to $FLOW_HOME/bench/tracking_outage-<time>.json. Needs no Kafka and no Spark.
"""

from __future__ import annotations

import argparse
import logging
import socket
import tempfile
import time
from pathlib import Path

import psutil
from _results import save
from handoff import CARDINALITIES, DENSE, SPARSE, criteo_rows, write_channel

from flow import stack as services
from flow.config import StackConfig
from flow.console import console
from flow.pipeline.state import Layout
from flow.training import ModelConfig, TrainConfig
from trainers.train import train

NEEDS_SERVICES = False  # its own MLflow server; Kafka would take CPU it measures
NEEDS_SPARK = False
out = console()
# Tables of at most 10,000 rows: ids beyond are hashed down, and the model stays small.
LAYOUT = Layout(
    dense=tuple(f"d{j}" for j in range(DENSE)),
    sparse=tuple((f"c{j}", min(10_000, int(CARDINALITIES[j]))) for j in range(SPARSE)),
    sequences=(),
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Hang:
    """A server's processes stopped (SIGSTOP) and resumed."""

    def __init__(self, pid: int) -> None:
        server = psutil.Process(pid)
        self.processes = [server, *server.children(recursive=True)]

    def start(self) -> None:
        for process in self.processes:
            process.suspend()

    def end(self) -> None:
        for process in self.processes:
            process.resume()


class Windows:
    """A trainer's ``say``: after a first window of ``size`` steps, the server hung in every
    other one until step ``last``; the time each window took."""

    def __init__(self, hang: Hang, size: int, last: int) -> None:
        self.hang, self.size, self.last = hang, size, last
        self.ends: list[float] = []

    def __call__(self, line: str) -> None:
        if not line.startswith("step "):
            out.print(f"  [dim]{line}[/]", highlight=False)
            return
        step = int(line.split()[1].rstrip(":"))
        if step % self.size == 0:
            self.ends.append(time.perf_counter())
            if (step // self.size) % 2 and step < self.last:
                self.hang.start()
            else:
                self.hang.end()

    def seconds(self, hung: bool) -> float:
        took = [b - a for a, b in zip(self.ends, self.ends[1:], strict=False)]
        return sum(took[0 if hung else 1 :: 2])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2010, help="steps of each run")
    parser.add_argument("--window", type=int, default=10, help="steps of each window")
    parser.add_argument("--log-every", type=int, default=1, help="steps between metric logs")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3, help="runs")
    args = parser.parse_args(argv)
    windows = args.steps // args.window
    if args.window % args.log_every or args.steps % args.window or windows % 2 == 0:
        parser.error("--window: a multiple of --log-every; --steps: an odd number of windows")
    import mlflow  # noqa: F401  (it sets its loggers' levels when imported: set ours after)

    logging.getLogger("mlflow").setLevel(logging.ERROR)  # two lines per exported model otherwise
    with tempfile.TemporaryDirectory(prefix="flow-bench-") as folder:
        root = Path(folder)
        env = {"FLOW_HOME": str(root / "home"), "FLOW_MLFLOW_PORT": str(_free_port())}
        stack = StackConfig.from_env(env)
        (row,) = services.up(stack, ("mlflow",))
        if not row.healthy or row.pid is None:
            raise SystemExit(f"the MLflow server did not start: {row}")
        hang = Hang(row.pid)
        try:
            rows = args.steps * args.batch_size
            write_channel(root / "handoff", "criteo", [criteo_rows(rows, 0)], 0, layout=LAYOUT)
            config = TrainConfig(
                handoff=str(root / "handoff"),
                channels=("criteo",),
                model=ModelConfig("dlrm", embedding_dim=16, hidden=(64, 32), bottom=(32,)),
                batch_size=args.batch_size,
                device="cpu",
                epochs=2,
                max_steps=args.steps,
                log_every=args.log_every,
                experiment="bench-tracking-outage",
            )
            rows_each = (windows - 1) // 2 * args.window * args.batch_size  # in one kind
            up, hung = 0.0, 0.0
            for n in range(args.repeat):
                timed = Windows(hang, args.window, args.steps)
                train(config, tracking_uri=stack.mlflow.tracking_uri, say=timed)
                up += timed.seconds(hung=False)
                hung += timed.seconds(hung=True)
                out.print(
                    f"run {n + 1}: {rows_each / timed.seconds(hung=False):,.0f} samples/s with "
                    f"MLflow up, {rows_each / timed.seconds(hung=True):,.0f} with it hung"
                )
        finally:
            hang.end()
            services.down(stack, ("mlflow",))
    up_rate, hung_rate = rows_each * args.repeat / up, rows_each * args.repeat / hung
    out.print(
        f"[bold]all runs: {up_rate:,.0f} samples/s with MLflow up, "
        f"{hung_rate:,.0f} with it hung: {up / hung:.2f}x[/]"
    )
    results = {
        "settings": vars(args),
        "samples_per_s_up": up_rate,
        "samples_per_s_hung": hung_rate,
        "seconds_up": up,
        "seconds_hung": hung,
    }
    out.print(f"results: {save('tracking_outage', results)}")


if __name__ == "__main__":
    main()
