"""Waiting on a live stage's query, reading its progress, and starting it again when it fails.

:class:`Supervisor` runs the query and, when it fails, starts it again from its checkpoint with
backoff (:func:`backoff_s`), up to ``RunOptions.max_restarts`` times; causes no restart mends (an
error of the pipeline itself, a full disk, a write refused) stop it at once, and ``--duration``
counts from the first start, restarts included. Each restart is one line and an MLflow metric,
naming the root cause's class and message (:class:`StreamFailedError`, from spark_jobs.failures:
the batch function's own exception where the driver holds it, kept by :func:`recording`).

:func:`_await` waits on one start of the query: until it ends, fails, ``stop()`` or the deadline,
stopping it between micro-batches; :func:`_poll` reads each batch's progress once (rows, rates,
state rows) into the run's :class:`Watch` and the ``on_batch`` metrics, with how far behind the
stage is once the batch is done (spark_jobs.live.lag: the records past the batch's end offsets on
the broker, the event-time delay), also one console line a batch.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame
from pyspark.sql.streaming.query import StreamingQuery

from flow.errors import FlowError
from flow.pipeline.run import RunOptions
from spark_jobs.failures import root_cause
from spark_jobs.live.inplan import DimensionsChangedError
from spark_jobs.live.lag import (
    Offsets,
    OffsetsUnknownError,
    batch_offsets,
    epoch_seconds,
    event_time_delay,
    records_behind,
)
from spark_jobs.live.steps import BEFORE_SINK, STEPS, BatchSteps, step_metrics, with_prepare
from spark_jobs.stage import Progress

__all__ = [
    "Latest",
    "OnBatch",
    "StreamFailedError",
    "Supervisor",
    "Watch",
    "backoff_s",
    "recording",
]

OnBatch = Callable[[dict[str, float], int], None]
"""Takes a micro-batch's metrics (or a restart's count) and the batch id they belong to."""


class StreamFailedError(FlowError):
    """A streaming query of a live stage stopped with an error."""

    def __init__(
        self, message: str, *, cause: str = "", transient: bool = True, remedy: str = ""
    ) -> None:
        super().__init__(message)
        self.cause = cause or message
        """The root cause in one line: its class and message."""
        self.transient = transient
        """Worth a restart: not a cause that any restart meets again (a full disk, a refused
        write, an error of the pipeline itself)."""
        self.remedy = remedy
        """What to change, for a cause that is not transient."""
        self.refresh = False
        """Not a failure: the query stopped to start again with changed dimension tables
        (spark_jobs.live.inplan)."""

    @classmethod
    def of(cls, query: str, error: str, recorded: BaseException | None = None) -> StreamFailedError:
        """From a query's exception text and, where the batch function raised it on the
        driver, the exception itself (``recorded``): the root cause, by its class."""
        root = root_cause(recorded, error)
        if root is not None:
            cause, transient, remedy = str(root), root.transient, root.remedy
        else:  # no exception class in it: Spark's first line after its preamble
            text = error.split("terminated with exception:", 1)[-1].strip()
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            cause, transient, remedy = (lines[0] if lines else text)[:400], True, ""
        failed = cls(
            f"the {query} query failed: {cause}", cause=cause, transient=transient, remedy=remedy
        )
        failed.refresh = isinstance(recorded, DimensionsChangedError) or (
            DimensionsChangedError.__name__ in error
        )
        return failed


@dataclass
class Watch:
    """What the query's progress said during this run (and across its restarts)."""

    seen: set[str] = field(default_factory=set)
    records_read: dict[int, int] = field(default_factory=dict)
    """Kafka records each batch read, by batch id, as its writer counted them (Spark's
    ``numInputRows`` counts a topic once per scan in the plan: once since ``_read_once``, but
    twice with ``spark.sql.exchange.reuse`` off)."""
    steps: BatchSteps = field(default_factory=dict)
    """The writer's steps' seconds, by batch id (spark_jobs.live.steps)."""
    rows_in: int = 0
    state_rows: int | None = None
    """Rows in the query's state after its last batch, as its progress says (None when the
    state store does not count them: _spark_counts_state)."""
    counts_state: bool = True
    batches: int = 0
    restarts: int = 0
    last_batch: int = 0
    batch_error: BaseException | None = None
    """What the batch function raised last, as the driver caught it: the exception itself,
    whose class Spark's text of it (a traceback) only names."""


Latest = Callable[[list[tuple[str, int]]], Offsets]
"""The latest offsets of Kafka partitions now (spark_jobs.live.lag.LatestOffsets)."""


def _behind(
    progresses: list[dict[str, Any]], latest: Latest | None, progress: Progress
) -> list[dict[str, float]]:
    """Each batch's records behind the broker's latest offsets and its event-time delay. The
    broker is asked once for every batch polled together: a batch polled with a later one is
    measured a little after it ended (one poll, two seconds at most), which overstates it."""
    ends = [batch_offsets(p) for p in progresses]
    now: Offsets = {}
    partitions = sorted({(t, p) for end in ends for t, parts in end.items() for p in parts})
    if latest is not None and partitions:
        try:
            now = latest(partitions)
        except OffsetsUnknownError as exc:  # the batch is written: only its lag is unknown
            progress(f"no Kafka lag for this poll's batches: {exc}")
    return [
        records_behind(end, now) | event_time_delay(p)
        for end, p in zip(ends, progresses, strict=True)
    ]


def _line(batch_id: int, metrics: dict[str, float]) -> str:
    """A batch's console line: what it read, how long it took, how far behind it left the
    stage."""
    said = (
        f"batch {batch_id}: {metrics['batch_rows_in']:,.0f} records in "
        f"{metrics['batch_duration_ms'] / 1000:.1f}s"
    )
    steps = [s for s in STEPS if f"batch_{s}_ms" in metrics]
    if steps:
        said += " (" + ", ".join(f"{s} {metrics[f'batch_{s}_ms'] / 1000:.1f}s" for s in steps) + ")"
    if "kafka_lag" in metrics:
        said += (
            f"; {metrics['kafka_lag']:,.0f} records behind Kafka's latest "
            f"(at most {metrics['kafka_lag_max']:,.0f} a partition)"
        )
    if "event_time_delay_s" in metrics:
        said += f"; newest event {metrics['event_time_delay_s']:.1f}s old"
    return said


def _poll(
    query: StreamingQuery,
    watch: Watch,
    on_batch: OnBatch,
    latest: Latest | None = None,
    progress: Progress = lambda _m: None,
) -> None:
    fresh: list[dict[str, Any]] = []
    for each in query.recentProgress:
        data: dict[str, Any] = json.loads(each.json)
        key = f"{data['runId'] if 'runId' in data else data['id']}:{data['batchId']}"
        if key not in watch.seen:
            watch.seen.add(key)
            fresh.append(data)
    if not fresh:
        return
    for data, behind in zip(fresh, _behind(fresh, latest, progress), strict=True):
        scanned = int(data["numInputRows"])
        # A batch the writer skipped (a replay) has no count of its own: Spark's is used.
        rows = watch.records_read.pop(int(data["batchId"]), scanned)
        operators = data.get("stateOperators") or []
        watch.rows_in += rows
        if operators and watch.counts_state:
            watch.state_rows = sum(int(o["numRowsTotal"]) for o in operators)
        watch.batches += 1
        watch.last_batch = int(data["batchId"])
        metrics = {
            "batch_rows_in": float(rows),
            # Spark's count, once per scan of a topic in the plan: above batch_rows_in, a
            # topic was read more than once (the exchange _read_once sets up not reused).
            "batch_rows_scanned": float(scanned),
            "batch_input_rows_per_s": float(data.get("inputRowsPerSecond") or 0.0),
            "batch_processed_rows_per_s": float(data.get("processedRowsPerSecond") or 0.0),
            "batch_duration_ms": float(data["durationMs"].get("triggerExecution", 0)),
            # addBatch is the foreachBatch sink; the rest is reading, state and commits.
            "batch_sink_ms": float(data["durationMs"].get("addBatch", 0)),
            # Before the batch's jobs: its offsets fixed, its plan made (freshness's
            # breakdown, benchmarks/freshness.py); and when it started (epoch seconds).
            "batch_planning_ms": float(sum(data["durationMs"].get(k, 0) for k in BEFORE_SINK)),
            "batch_started_s": epoch_seconds(data["timestamp"]),
            # Where addBatch's time went (none for a replay the writer skipped).
            **_steps(watch, int(data["batchId"]), data["durationMs"].get("addBatch", 0)),
            **({} if watch.state_rows is None else {"state_rows": float(watch.state_rows)}),
            **behind,
        }
        progress(_line(watch.last_batch, metrics))
        on_batch(metrics, watch.last_batch)


def _steps(watch: Watch, batch_id: int, sink_ms: float) -> dict[str, float]:
    """A batch's steps in its sink as metrics, once: Spark's preparing it, then the writer's."""
    seconds = watch.steps.pop(batch_id, None)
    return step_metrics(with_prepare(seconds, float(sink_ms))) if seconds else {}


def _failure(query: StreamingQuery, watch: Watch) -> StreamFailedError | None:
    error = query.exception()
    if error is None:
        return None
    return StreamFailedError.of(query.name or "stream", str(error), watch.batch_error)


def _await(
    query: StreamingQuery,
    options: RunOptions,
    watch: Watch,
    on_batch: OnBatch,
    progress: Progress,
    stop: Callable[[], bool],
    deadline: float | None = None,
    latest: Latest | None = None,
) -> None:
    """Wait on ``query`` until it ends, fails, ``stop()`` or ``deadline`` (monotonic; from
    ``options.duration_s`` from now if not given); each batch's lag from ``latest``."""
    if deadline is None and options.duration_s is not None:
        deadline = time.monotonic() + options.duration_s
    try:
        while query.isActive:
            failed = _failure(query, watch)
            if failed is not None:
                _poll(
                    query, watch, on_batch, latest, progress
                )  # the batches it finished before failing
                raise failed
            try:
                query.awaitTermination(2)
            except StreamingQueryException as error:  # it failed while we waited
                _poll(query, watch, on_batch, latest, progress)
                raise StreamFailedError.of(
                    query.name or "stream", str(error), watch.batch_error
                ) from None
            _poll(query, watch, on_batch, latest, progress)
            if deadline is not None and time.monotonic() > deadline:
                progress(f"duration of {options.duration_s:.0f}s reached; stopping the query")
                _stop_between_batches(query)
                break
            if stop():
                progress("asked to stop; stopping the query")
                _stop_between_batches(query)
                break
    finally:
        if query.isActive:
            query.stop()
    _poll(query, watch, on_batch, latest, progress)
    failed = _failure(query, watch)
    if failed is not None:
        raise failed


def recording(
    writer: Callable[[DataFrame, int], None], watch: Watch
) -> Callable[[DataFrame, int], None]:
    """``writer`` as the query's batch function, keeping what it raises in ``watch``: Spark
    passes on only its text, the class that classifies it (spark_jobs.failures) stays here."""

    def batch(frame: DataFrame, batch_id: int) -> None:
        try:
            writer(frame, batch_id)
        except BaseException as exc:
            watch.batch_error = exc
            raise

    return batch


def _stop_between_batches(query: StreamingQuery, patience_s: float = 60.0) -> None:
    """Stop the query once its running micro-batch (if any) is done.

    ``stop()`` interrupts a batch wherever it is, possibly between its training commit and the
    commit of its counts (LiveRun.count reports such a batch apart; the next run replays it).
    Between batches there is nothing to interrupt; a query that falls behind its trigger starts
    the next batch at once, so this lowers the odds rather than rule it out.
    """
    deadline = time.monotonic() + patience_s
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.1)
    query.stop()


def backoff_s(attempt: int) -> float:
    """Seconds before restart ``attempt`` (1, 2, ...): doubling from 2 s, at most a minute."""
    return float(min(60, 2**attempt))


@dataclass(frozen=True)
class Supervisor:
    """Runs a live stage's query, and starts it again from its checkpoint when it fails."""

    stage: str
    """The stage's name, as each line says it."""
    options: RunOptions
    """``max_restarts``; ``duration_s``, counted from the first start."""
    on_batch: OnBatch
    progress: Progress
    stop: Callable[[], bool]
    sleep: Callable[[float], None] = time.sleep
    latest: Latest | None = None
    """The broker's latest offsets, which each batch's lag is measured against (None: no lag
    reported)."""

    def run(self, start: Callable[[], StreamingQuery], watch: Watch) -> None:
        """Run the query ``start()`` starts; when it fails, start it again from its checkpoint
        after a pause, up to ``max_restarts`` times. An error of the pipeline itself is raised
        at once."""
        limit, name = self.options.max_restarts, self.stage
        duration = self.options.duration_s
        # From the first start: restarts spend the duration, they do not renew it.
        deadline = None if duration is None else time.monotonic() + duration
        while True:
            watch.batch_error = None
            query = start()
            try:
                _await(
                    query,
                    self.options,
                    watch,
                    self.on_batch,
                    self.progress,
                    self.stop,
                    deadline,
                    self.latest,
                )
                return
            except StreamFailedError as failure:
                if failure.refresh:
                    self.progress(
                        f"{name}: a dimension table changed; the query starts again "
                        "from its checkpoint to read it"
                    )
                    continue
                if not failure.transient:
                    why = f" ({failure.remedy})" if failure.remedy else ""
                    raise StreamFailedError(
                        f"live stage {name!r} stopped, not restarted: {failure.cause}{why}",
                        cause=failure.cause,
                        transient=False,
                        remedy=failure.remedy,
                    ) from failure
                if watch.restarts >= limit:
                    raise StreamFailedError(
                        f"live stage {name!r} gave up after {watch.restarts} "
                        f"restart(s) (--max-restarts {limit}): {failure.cause}",
                        cause=failure.cause,
                        transient=False,
                    ) from failure
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise StreamFailedError(
                        f"live stage {name!r} failed as its --duration of {duration:.0f}s "
                        f"ran out, after {watch.restarts} restart(s): {failure.cause}",
                        cause=failure.cause,
                        transient=False,
                    ) from failure
                watch.restarts += 1
                pause = backoff_s(watch.restarts)
                if left is not None:
                    pause = min(pause, left)
                self.progress(
                    f"{name}: the query failed ({failure.cause}); restart "
                    f"{watch.restarts}/{limit} from its checkpoint in {pause:.0f}s"
                )
                self.on_batch({"restarts": float(watch.restarts)}, watch.last_batch)
                self.sleep(pause)
