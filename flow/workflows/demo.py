"""``flow demo``: the whole product on the local stack, end to end, in a few minutes.

1. fresh data in the ``demo`` namespace: Iceberg users and items and days of impression and
   click history from a world that drifts (category appeal, new items), up to now;
2. one Spark job (``pipelines/ctr_demo.py``): the backfill stage fits the features over the
   history and writes channel ``backfill``; the live stage then runs for ``live_s`` seconds on
   Kafka in micro-batches, each a commit on channel ``live``, emitting every impression at once
   and again when its click comes (``immediate`` labels);
3. beside it, in real time, a stream of impressions stamped as they are sent, each click sent
   when it comes due (it starts when the backfill is done, with the live stage);
4. beside both, a trainer (DLRM) reads ``backfill`` and then follows ``live`` as commits land,
   correcting the immediate labels' bias (fake-negative weighted loss);
5. a summary read back from MLflow and the channel (flow.workflows.demo_summary): the model's
   AUC beside the oracle's (the world's true click probability) on the same rows, the live
   rows' corrected positive rate and calibration, and freshness from production to commit and
   to training.

Each run starts the namespace afresh (topics, checkpoints, channels, feature state), so its
counts reconcile on their own. Given a :class:`~flow.terminal.Terminal`, each part's lines are
prefixed with its name (``demo``, ``generator``, ``spark``, ``trainer``) and a
:class:`DemoStatus` tells its ticker where the run is.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from flow.config import StackConfig
from flow.handoff.channel import Channel
from flow.storage import namespace_locations
from flow.terminal import Terminal, elapsed, inherit
from flow.training import ModelConfig, OptimConfig, TrainConfig

__all__ = ["DemoSize", "DemoStatus", "log_path", "run_demo"]

NAMESPACE = "demo"
MODEL_NAME = "ctr-demo"


@dataclass(frozen=True)
class DemoSize:
    days: int = 3
    per_day: int = 20_000
    rate: float = 1000.0
    """Live impressions per second, in real time (their clicks come on top)."""
    live_s: float = 240.0
    """Seconds of new impressions in the real-time stream. The first minute's impressions are
    scored while none of their clicks has come yet (mean delay 45 s): a shorter or slower
    stream is mostly that minute, and its live AUC says little
    (docs/experiments/2026-11-23-freshness-and-demo.md)."""
    drain_s: float = 90.0
    """Seconds the stream goes on sending the clicks that come due, without new impressions,
    and the live stage with it: the last impressions' labels complete (mean click delay 45 s)."""
    trigger: str = "5 seconds"
    """The live stage's micro-batch interval."""
    per_batch: int = 20_000
    malformed_share: float = 0.02
    batch_size: int = 1024
    labels: Literal["window", "immediate"] = "immediate"
    """When the live stage emits an impression (LabelJoin.strategy)."""
    full_batches: bool = False
    """The trainer's ``--full-batches``: a commit's rows short of a batch wait for the next
    commit (before whole commits, issue 47), for a comparison."""

    def command(self) -> str:
        """The ``flow demo`` command line that runs this size again."""
        options = {
            "--days": self.days,
            "--per-day": self.per_day,
            "--rate": f"{self.rate:g}",
            "--live-seconds": f"{self.live_s:g}",
            "--drain-seconds": f"{self.drain_s:g}",
            "--trigger": self.trigger,
            "--per-batch": self.per_batch,
            "--labels": self.labels,
        }
        return shlex.join(["flow", "demo", *(str(a) for o in options.items() for a in o)])


def _reset(stack: StackConfig, namespace: str, say: Callable[[str], None]) -> None:
    from flow.stack.kafka import delete_topics
    from flow.workflows.loading import topics

    delete_topics(stack.kafka, topics(namespace).values())
    where = namespace_locations(stack, namespace)
    for folder in (where.checkpoints, where.handoff, where.feature_state):
        folder.remove()
    say(f"namespace {namespace}: topics, checkpoints, channels and feature state reset")


def _history(
    stack: StackConfig, size: DemoSize, namespace: str, say: Callable[[str], None]
) -> None:
    from flow.workflows.loading import write_history
    from flow.workflows.synthetic import SyntheticWorld

    history = write_history(
        stack,
        SyntheticWorld(seed=7, users=10_000, items=2_000),
        namespace=namespace,
        days=size.days,
        per_day=size.per_day,
        end=datetime.now(UTC),
        progress=say,
    )
    say(f"history: {history.impressions:,} impressions, {history.clicks:,} clicks in Iceberg")


class _LiveStream:
    """The real-time stream of the demo, on a thread: it waits for the backfill's channel to
    close (the live stage starts then), sends for ``live_s`` seconds, and says what it sent."""

    def __init__(
        self, stack: StackConfig, size: DemoSize, namespace: str, say: Callable[[str], None]
    ) -> None:
        self.stack, self.size, self.namespace, self.say = stack, size, namespace, say
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="demo-stream", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        from flow.workflows.loading import produce_realtime
        from flow.workflows.streaming import Realtime

        try:
            where = namespace_locations(self.stack, self.namespace).handoff.uri
            backfill = Channel(where, "backfill")
            while not (backfill.exists() and backfill.closed()):
                if self.stopping.wait(1.0):
                    return
            size = self.size
            self.say(
                f"stream: {size.rate:g} impressions/s in real time for {size.live_s:g} s, then "
                f"{size.drain_s:g} s of the clicks still to come"
            )
            config = Realtime(
                rate=size.rate,
                duration=size.live_s,
                drain=size.drain_s,
                malformed_share=size.malformed_share,
            )
            report = produce_realtime(
                self.stack,
                config,
                namespace=self.namespace,
                progress=self.say,
                stop=self.stopping.is_set,
            )
            self.say(
                f"stream: {report.impressions:,} impressions ({sum(report.malformed.values()):,} "
                f"malformed) and {report.clicks:,} clicks sent; {report.pending_clicks:,} clicks "
                "not due yet when it stopped"
            )
        except BaseException as error:  # reported by the demo, which goes on without it
            self.error = error

    def __enter__(self) -> _LiveStream:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)
        if self.error is not None:
            self.say(f"stream: failed ({type(self.error).__name__}: {self.error})")


def log_path(stack: StackConfig) -> Path:
    """A new file for the whole output of one demo run, under ``$FLOW_HOME/logs``."""
    folder = stack.home / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"demo-{datetime.now(UTC):%Y%m%d-%H%M%S}.log"


class DemoStatus:
    """What the demo's ticker says when nothing else has for a while: the phase, how long the
    run has gone, and, once the Spark job writes, how far each channel and the trainer are."""

    def __init__(
        self, stack: StackConfig, namespace: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.phase = "starting"
        self.clock = clock
        self.started = clock()
        self.where = namespace_locations(stack, namespace).handoff.uri
        self._channels: dict[str, Channel] = {}
        self.following = False
        """Whether the Spark job and the trainer run: then the channels say how far they are."""

    def __call__(self) -> str:
        said = f"{self.phase}, {elapsed(self.clock() - self.started)} in"
        if not self.following:
            return said
        progress = [self._channel(name) for name in ("backfill", "live")]
        shown = [p for p in progress if p]
        if not shown:
            return f"{said}; the Spark job is starting (JVM, session, the history's first read)"
        return f"{said}; " + "; ".join(shown)

    def _channel(self, name: str) -> str:
        """``live: 12 commits, 48,000 rows, the trainer has read 40,000`` ('' before it exists)."""
        channel = self._channels.get(name)
        if channel is None:
            channel = Channel(self.where, name)
            if not channel.exists():
                return ""
            self._channels[name] = channel
        ids = channel.commit_ids()
        said = f"{name}: {len(ids):,} commit{'s' * (len(ids) != 1)}, "
        said += f"{channel.log.rows(ids, None):,} rows"
        try:
            read = [p.consumed_upto for ranks in channel.positions().values() for p in ranks]
        except (OSError, ValueError):  # a position being written as it is read: next time
            read = []
        if read:
            upto = min(read)
            done = channel.log.rows([b for b in ids if b <= upto], None)
            said += f", the trainer has read {done:,}"
        return said + (" (closed)" if channel.closed() else "")


def run_demo(
    stack: StackConfig,
    size: DemoSize,
    launch_spark: Callable[[Sequence[str], dict[str, str]], int],
    say: Callable[[str], None],
    namespace: str = NAMESPACE,
    *,
    terminal: Terminal | None = None,
    status: DemoStatus | None = None,
) -> str:
    """Data, Spark job, real-time stream and trainer; the MLflow run they nest under.

    With a ``terminal``, the generator's and the trainer's lines are theirs (prefixed with
    their names); ``launch_spark`` relays Spark's itself. ``status`` follows the phases."""
    from flow.workflows.together import run_together

    generator = terminal.say_as("generator") if terminal else say
    start_trainer = terminal.start_as("trainer") if terminal else inherit
    status = status or DemoStatus(stack, namespace)
    status.phase = "resetting the namespace"
    _reset(stack, namespace, say)
    status.phase = "writing the history to Iceberg"
    _history(stack, size, namespace, generator)
    trainer = TrainConfig(
        channels=("backfill", "live"),
        namespace=namespace,
        model=ModelConfig("dlrm"),
        optim=OptimConfig(lr=0.01),
        batch_size=size.batch_size,
        full_batches=size.full_batches,
        log_every=20,
        event_time="ts",
        # The synthetic world's true click probability: the summary prints the oracle's AUC
        # beside the model's, on the same rows.
        oracle="p_click",
        # What training on live rows is worth: the model as the backfill left it scores them too.
        frozen_after="backfill",
        register_as=MODEL_NAME,
        checkpoint_every=100,
    )
    app = [
        "pipelines/ctr_demo.py",
        "--namespace",
        namespace,
        "--max-records-per-batch",
        str(size.per_batch),
        "--trigger",
        size.trigger,
        "--label-strategy",
        size.labels,
        "--continuous",
        "--duration",
        f"{size.live_s + size.drain_s:g}",
        # The demo prints one table of its own at the end, with the model's figures beside the
        # stages' counts: the driver's would say the same counts twice.
        "--no-summary",
    ]
    status.phase = "Spark job (backfill, then live) and trainer"
    status.following = True
    with _LiveStream(stack, size, namespace, generator):
        done = run_together(
            app,
            trainer,
            1,
            stack,
            launch_spark,
            say,
            experiment="pipeline-ctr_demo",
            start_trainer=start_trainer,
        )
    if done.code:
        raise SystemExit(done.code)
    return done.run_id
