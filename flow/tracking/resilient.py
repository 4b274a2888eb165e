"""A run whose logging never waits on the tracking server: a bounded queue, one sending thread.

Training loops and streams call :class:`ResilientRun`; the call is queued and returns at once. A
daemon thread sends the queue in order, so a slow or dead server costs the caller nothing: while
it is down the calls wait (up to a bound), and when it is back they arrive, each metric point
with the step and time it was logged at.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from flow.tracking.base import MetricPoint, Run

__all__ = ["ResilientRun"]

POINTS_PER_REQUEST = 1000
"""Consecutive metric calls are merged into one request of at most this many points (the
most MLflow's ``log_batch`` takes)."""


@dataclass(frozen=True)
class _Call:
    method: str
    args: tuple[Any, ...]
    points: tuple[MetricPoint, ...] | None = None
    """A metric call's points (None for the other calls)."""
    alone: bool = False
    """Sent on its own: it was part of a merged request the server rejected."""


@dataclass
class _Outage:
    since: float
    """Wall-clock time of the first failed call."""
    started: float
    """The same on the monotonic clock."""
    up_after: float | None = None
    """Seconds from the first failure to the first success since (None: still down)."""
    sent: int = 0
    dropped: int = 0


def _rejected(exc: Exception) -> bool:
    """Whether the server refused the call itself (HTTP 4xx): sending it again would fail again.

    MLflow raises transport failures and timeouts as errors with status 500, which are retried.
    """
    status = getattr(exc, "get_http_status_code", None)
    code = status() if callable(status) else None
    return isinstance(code, int) and 400 <= code < 500 and code not in (408, 429)


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"


class ResilientRun:
    """A run whose logging never blocks and never raises: jobs outlive their tracking server.

    Every call is queued and returns at once (only a metric value that is not a number raises,
    in the caller); ``log_dict``'s data is sent as it is then, so do not change it afterwards.
    One daemon thread sends the queue in order, consecutive metric calls merged into one
    request when the run takes points (``log_points``, as MLflow runs do): the first call after
    a quiet spell goes at once, then at most one request every ``send_every`` seconds carries
    what came meanwhile. A metric point keeps the step and the time it was logged with: points
    logged during an outage arrive later, where they belong, and resending one is harmless.

    A failed send starts an outage, reported once (where, since when, how many calls wait); the
    call stays first in line and is retried every ``retry_after`` seconds and at once on
    ``flush``. Its end is reported once, when the backlog is sent (after how long, how many
    calls). At most ``max_pending`` calls wait besides the one being sent: beyond, the oldest are
    dropped, counted (``dropped``) and reported. A call the server refuses (HTTP 4xx: a bad value,
    a parameter logged again with another value, a deleted run) is reported and dropped
    (``rejected``) rather than retried for ever.

    ``flush(timeout)`` waits, at most ``timeout`` seconds, for the queue to be sent; ``close()``
    (or leaving a ``with`` block) flushes and stops the thread. A call after ``close()`` starts
    it again. What is still queued when the process exits is lost, and ``close()`` says so.
    """

    def __init__(
        self,
        run: Run,
        report: Callable[[str], None],
        *,
        retry_after: float = 5.0,
        max_pending: int = 10_000,
        flush_timeout: float = 60.0,
        send_every: float = 0.5,
    ) -> None:
        if retry_after < 0 or send_every < 0:
            raise ValueError(
                f"retry_after and send_every are seconds >= 0, got {retry_after}, {send_every}"
            )
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending}")
        self.run = run
        self.run_id = run.run_id
        self.report = report
        self.retry_after = retry_after
        self.max_pending = max_pending
        self.flush_timeout = flush_timeout
        self.send_every = send_every
        self.where = f"MLflow at {getattr(run, 'tracking_uri', None) or 'its tracking server'}"
        self.sent = 0
        """Calls sent."""
        self.dropped = 0
        """Calls dropped, oldest first, because more than ``max_pending`` waited."""
        self.rejected = 0
        """Calls the server refused."""
        self._points: Callable[[list[MetricPoint]], None] | None = getattr(run, "log_points", None)
        self._queue: deque[_Call] = deque()
        self._sending = 0
        self._cond = threading.Condition()
        self._worker: threading.Thread | None = None
        self._stop = False
        self._kick = False
        self._flushing = 0  # callers waiting in flush()
        self._outage: _Outage | None = None
        self._dropping = False  # reported since the queue last drained

    # The Run interface: queue and return.

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._put(_Call("log_params", (dict(params),)))

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        now = int(time.time() * 1000)
        at = int(step) if step is not None else 0
        points = tuple(MetricPoint(k, float(v), at, now) for k, v in metrics.items())
        values = {p.key: p.value for p in points}
        self._put(_Call("log_metrics", (values, step), points))

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._put(_Call("set_tags", (dict(tags),)))

    def log_dict(self, data: Any, artifact_file: str) -> None:
        self._put(_Call("log_dict", (data, artifact_file)))

    # Waiting and stopping.

    @property
    def pending(self) -> int:
        """Calls not sent yet (queued, or being sent)."""
        with self._cond:
            return len(self._queue) + self._sending

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued call is sent, at most ``timeout`` seconds (default
        ``flush_timeout``); True when nothing is left. A waiting retry is tried at once."""
        limit = self.flush_timeout if timeout is None else timeout
        with self._cond:
            if self._queue:
                self._start()
            self._kick = True
            self._flushing += 1
            self._cond.notify_all()
            try:
                done = self._cond.wait_for(lambda: not self._queue and not self._sending, limit)
            finally:
                self._flushing -= 1
            left = len(self._queue) + self._sending
            outage = self._outage
        if not done:
            down = f"; unreachable since {_clock(outage.since)}" if outage else ""
            self._say(f"{self.where}: {left} calls still queued after {limit:g} s{down}")
        return done

    def close(self, timeout: float | None = None) -> bool:
        """Flush (at most ``timeout`` seconds, default ``flush_timeout``), then stop the thread;
        True when everything was sent."""
        done = self.flush(timeout)
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            worker = self._worker
        if done and worker is not None:
            worker.join(timeout=5.0)  # idle: it sees the stop at once
        return done

    def __enter__(self) -> ResilientRun:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # The queue.

    def _put(self, call: _Call) -> None:
        with self._cond:
            self._queue.append(call)
            said = self._bound()
            self._start()
            self._cond.notify_all()
        self._say(said)

    def _start(self) -> None:
        """Start the sending thread unless it runs (caller holds the lock)."""
        self._stop = False
        if self._worker is None:
            self._worker = threading.Thread(
                target=self._drain, name=f"tracking-{self.run_id[:8]}", daemon=True
            )
            self._worker.start()

    def _bound(self) -> str | None:
        """Drop the oldest calls beyond ``max_pending`` (caller holds the lock); what to say."""
        over = len(self._queue) - self.max_pending
        if over <= 0:
            return None
        for _ in range(over):
            self._queue.popleft()
        self.dropped += over
        if self._outage is not None:
            self._outage.dropped += over
        if self._dropping:
            return None
        self._dropping = True
        return f"{self.where}: more than {self.max_pending} calls queued; dropping the oldest"

    def _take(self) -> list[_Call]:
        """The next request's calls: the first, and the metric calls that follow it (caller
        holds the lock)."""
        group = [self._queue.popleft()]
        first = group[0].points
        if first is None or group[0].alone or self._points is None:
            return group
        count = len(first)
        while self._queue:
            call = self._queue[0]
            if call.points is None or call.alone or count + len(call.points) > POINTS_PER_REQUEST:
                break
            group.append(self._queue.popleft())
            count += len(call.points)
        return group

    def _send(self, group: list[_Call]) -> None:
        if self._points is not None and group[0].points is not None:
            self._points([p for call in group for p in call.points or ()])
        else:
            getattr(self.run, group[0].method)(*group[0].args)

    def _drain(self) -> None:
        """The sending thread: one request at a time, in order; a failure waits and retries."""
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._queue) or self._stop)
                if self._stop:
                    self._worker = None
                    self._cond.notify_all()
                    return
                group = self._take()
                self._sending = len(group)
                self._kick = False  # a flush from now on retries a failure at once
            try:
                self._send(group)
                error = None
            except Exception as exc:  # any failure of the tracking client is survivable
                error = exc
            with self._cond:
                self._sending = 0
                if error is None:
                    said = self._sent(len(group))
                elif _rejected(error):
                    said = self._refused(group, error)
                else:
                    self._queue.extendleft(reversed(group))  # first in line again
                    said = self._down(error)
                    said = "\n".join(s for s in (said, self._bound()) if s) or None
                self._cond.notify_all()
            self._say(said)
            # After a failure, wait to retry; after a success, let the next calls gather into
            # one request (a loop that logs every few milliseconds costs a request per
            # ``send_every``, not one per call). A flush or a close cuts either wait short.
            with self._cond:
                if error is None:
                    self._cond.wait_for(
                        lambda: self._kick or self._stop or self._flushing > 0, self.send_every
                    )
                elif not _rejected(error):
                    self._cond.wait_for(lambda: self._kick or self._stop, self.retry_after)

    # What happened, and what to say about it (each called with the lock held).

    def _sent(self, count: int) -> str | None:
        self.sent += count
        idle = not self._queue
        if idle:
            self._dropping = False
        outage = self._outage
        if outage is None:
            return None
        if outage.up_after is None:
            outage.up_after = time.monotonic() - outage.started
        outage.sent += count
        if not idle:
            return None
        self._outage = None
        dropped = f", {outage.dropped} dropped" if outage.dropped else ""
        return f"{self.where} back after {outage.up_after:.0f} s; {outage.sent} calls sent{dropped}"

    def _down(self, error: Exception) -> str | None:
        if self._outage is not None:
            self._outage.up_after = None  # down again before the backlog was sent
            return None
        self._outage = _Outage(since=time.time(), started=time.monotonic())
        return (
            f"{self.where} unreachable since {_clock(self._outage.since)} ({_error(error)}); "
            f"{len(self._queue)} calls queued, retried every {self.retry_after:g} s"
        )

    def _refused(self, group: list[_Call], error: Exception) -> str | None:
        if len(group) > 1:  # one of the merged calls is bad: find it, keep the others
            self._queue.extendleft(
                reversed([_Call(c.method, c.args, c.points, alone=True) for c in group])
            )
            return None
        self.rejected += 1
        return f"{self.where} refused {group[0].method} ({_error(error)}); dropped it"

    def _say(self, message: str | None) -> None:
        if message:
            with contextlib.suppress(Exception):  # a broken reporter must not stop the sending
                self.report(message)


def _clock(when: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when))
