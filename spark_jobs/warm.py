"""The warm driver (``flow driver start``): a Spark driver that runs ``flow run``'s jobs.

Started under spark-submit with ``flow submit``'s settings, it creates its session, warms it
(a query, the catalog, a Python worker), writes ``$FLOW_HOME/driver/driver.json`` and serves
jobs one at a time until stopped or idle (see :mod:`flow.workflows.warm` for when a job comes
here and the wire). Each job runs as spark-submit would run its file, in this process:
``__main__``, its ``sys.argv``, folder and ``FLOW_*``/``MLFLOW_*`` variables, its output sent
back, in a new session of its own (:func:`job_session`). What it changed is put back after it:
variables, folder, ``sys.path``, signal handlers, the root logger's handlers, and the modules it
imported that are not flow's or installed packages (so an edited pipeline file is read again).
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import queue
import runpy
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import Any

from flow.config import LOOPBACK, StackConfig
from flow.workflows.warm import (
    DriverState,
    JobRequest,
    code_fingerprint,
    log_path,
    new_token,
    read_message,
    read_state,
    send_message,
    stack_fingerprint,
    state_path,
    token_matches,
    write_state,
)
from spark_jobs.jvm import (
    cancel_all_jobs,
    context_stop_replaced,
    context_stopped,
    launch_conf,
    make_current,
)

__all__ = ["JobStreams", "job_session", "main", "run_application"]

_KEPT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_STOP = object()


class _Wire(io.TextIOBase):
    """A text stream whose writes go to the job's caller as ``{"out": text, "fd": fd}``."""

    def __init__(self, send: Callable[[dict[str, Any]], None], fd: int) -> None:
        super().__init__()
        self._send = send
        self._fd = fd

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text:
            self._send({"out": text, "fd": self._fd})
        return len(text)


class JobStreams:
    """The caller's end of a job: its stdout and stderr, and the exit message. Writes from any
    thread (a streaming query's batches run on py4j's) are serialised; once the caller has gone,
    they are dropped."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self.gone = False
        self.stdout = _Wire(self.send, 1)
        self.stderr = _Wire(self.send, 2)

    def send(self, message: dict[str, Any]) -> None:
        with self._lock:
            if self.gone:
                return
            try:
                send_message(self._sock, message)
            except OSError:
                self.gone = True


# --- one job, as spark-submit would run it ----------------------------------------------------


class _Saved:
    """What a job may change in this process, taken before it and put back after."""

    def __init__(self) -> None:
        self.env = dict(os.environ)
        self.cwd = os.getcwd()
        self.argv = list(sys.argv)
        self.path = list(sys.path)
        self.modules = set(sys.modules)
        self.streams = (sys.stdin, sys.stdout, sys.stderr)
        self.signals = {s: signal.getsignal(s) for s in _KEPT_SIGNALS}
        self.handlers = list(logging.getLogger().handlers)

    def restore(self) -> None:
        for key in set(os.environ) - set(self.env):
            del os.environ[key]
        for key, value in self.env.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        os.chdir(self.cwd)
        sys.argv[:] = self.argv
        sys.path[:] = self.path
        sys.stdin, sys.stdout, sys.stderr = self.streams
        for sig, previous in self.signals.items():
            if previous is not None:
                signal.signal(sig, previous)
        root = logging.getLogger()
        for added in set(root.handlers) - set(self.handlers):
            root.removeHandler(added)
        for name in set(sys.modules) - self.modules:
            if not _kept(sys.modules[name]):
                del sys.modules[name]


def _kept(module: Any) -> bool:
    """Whether a module a job imported stays loaded: installed packages and flow's own (whose
    edits restart the driver, see flow.workflows.warm.code_fingerprint), not the job's files."""
    file = getattr(module, "__file__", None)
    if file is None:
        return True
    path = os.path.realpath(file)
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    root = Path(__file__).resolve().parents[1]
    prefixes |= {str(root / p) for p in ("flow", "spark_jobs", "trainers")}
    return any(path.startswith(p + os.sep) for p in prefixes)


def _exit_code(exit: SystemExit, stderr: io.TextIOBase) -> int:
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code
    print(exit.code, file=stderr)  # as Python does for sys.exit("message")
    return 1


def run_application(
    request: JobRequest,
    stdout: io.TextIOBase,
    stderr: io.TextIOBase,
    scope: Callable[[], AbstractContextManager[Any]],
) -> int:
    """Run ``request``'s file as ``__main__`` in ``scope``; its exit code. Whatever it changed
    in this process is put back (see :class:`_Saved`)."""
    saved = _Saved()
    app = os.path.join(request.cwd, request.argv[0])
    try:
        for key in [k for k in os.environ if k.startswith(("FLOW_", "MLFLOW_"))]:
            del os.environ[key]
        os.environ.update(request.env)
        os.chdir(request.cwd)
        sys.argv[:] = request.argv
        sys.path[:0] = [os.path.dirname(os.path.abspath(app))]  # as `python APP.py` does
        sys.stdin, sys.stdout, sys.stderr = io.StringIO(), stdout, stderr
        with scope():
            runpy.run_path(app, run_name="__main__")
        return 0
    except SystemExit as exit:
        return _exit_code(exit, stderr)
    except KeyboardInterrupt:
        print("flow: the job was cancelled", file=stderr)
        return 130
    except BaseException:  # the job's bug: its traceback, as python would print it
        traceback.print_exc(file=stderr)
        return 1
    finally:
        saved.restore()


def _stop_queries(session: Any) -> None:
    for query in session.streams.active:
        with suppress(Exception):  # a query that failed has stopped already
            query.stop()


@contextmanager
def job_session(base: Any) -> Iterator[Any]:
    """A new session for one job (its own SQL settings, temporary views and UDFs, the same
    SparkContext), the one every ``getActiveSession``/``builder.getOrCreate`` gives while it
    runs; after it, its streaming queries are stopped and ``base`` is current again."""
    session = base.newSession()
    make_current(session)
    # A job's `spark.stop()` (scripts end with it) would stop the SparkContext every job shares:
    # the driver outlives its jobs, so for the job it only ends its queries.
    setattr(session, "stop", lambda *_, **__: _stop_queries(session))  # noqa: B010
    try:
        with context_stop_replaced(base, lambda *_, **__: _stop_queries(session)):
            yield session
    finally:
        _stop_queries(session)
        make_current(base)
        base.catalog.clearCache()


# --- the server -------------------------------------------------------------------------------


class _Server:
    def __init__(self, spark: Any, idle_s: float, say: Callable[[str], None]) -> None:
        self.spark = spark
        self.idle_s = idle_s
        self.say = say
        self.token = new_token()
        self.listener = socket.create_server((LOOPBACK, 0))
        self.port: int = self.listener.getsockname()[1]
        self.jobs: queue.Queue[Any] = queue.Queue()
        self.busy = threading.Event()
        self.running: str = ""
        self.session: Any = None

    def accept_forever(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._greet, args=(sock,), daemon=True).start()

    def _greet(self, sock: socket.socket) -> None:
        try:
            sock.settimeout(10.0)
            first = read_message(sock)
            if not token_matches(first.get("token"), self.token):
                sock.close()
                return
            if first.get("stop"):
                sock.close()
                self.jobs.put(_STOP)
                return
            if self.busy.is_set():
                send_message(sock, {"busy": self.running})
                sock.close()
                return
            self.busy.set()
            self.jobs.put((sock, JobRequest(**first["job"])))
        except (OSError, EOFError, TypeError, KeyError, ValueError):
            sock.close()

    def serve(self) -> None:
        threading.Thread(target=self.accept_forever, daemon=True).start()
        while True:
            try:
                item = self.jobs.get(timeout=self.idle_s)
            except queue.Empty:
                self.say(f"idle for {self.idle_s / 60:.0f} min: stopping")
                return
            except KeyboardInterrupt:  # a cancel that came just as its job ended
                continue
            if item is _STOP:
                self.say("asked to stop")
                return
            sock, request = item
            try:
                self._run(sock, request)
            except KeyboardInterrupt:  # a cancel that came as the job ended
                pass
            finally:
                self.running = ""
                self.busy.clear()
            if context_stopped(self.spark):
                self.say("a job stopped the SparkContext: this driver cannot serve another")
                return

    def _run(self, sock: socket.socket, request: JobRequest) -> None:
        sock.settimeout(None)
        streams = JobStreams(sock)
        self.running = " ".join(request.argv)
        self.say(f"job: {self.running} (in {request.cwd})")
        started = time.monotonic()
        done = threading.Event()
        streams.send({"started": os.getpid()})
        threading.Thread(target=self._watch, args=(sock, done), daemon=True).start()

        @contextmanager
        def scope() -> Iterator[Any]:
            with job_session(self.spark) as session:
                self.session = session
                try:
                    yield session
                finally:
                    self.session = None

        code = run_application(request, streams.stdout, streams.stderr, scope)
        done.set()
        streams.send({"exit": code})
        sock.close()
        self.say(f"job ended: exit {code} after {time.monotonic() - started:.1f} s")

    def _watch(self, sock: socket.socket, done: threading.Event) -> None:
        """Cancel the job when its caller asks (Ctrl-C) or goes away."""
        try:
            while not done.is_set():
                if read_message(sock).get("cancel"):
                    break
        except (OSError, EOFError, ValueError):
            pass
        if done.is_set():
            return
        self.say("cancelling the job (its caller asked, or went away)")
        cancel_all_jobs(self.spark)
        session = self.session
        if session is not None:
            _stop_queries(session)
        if not done.is_set():
            # A signal, not _thread.interrupt_main(): it wakes a job out of a sleep or a wait,
            # as Ctrl-C would a driver of its own.
            main = threading.main_thread().ident
            if main is not None:
                signal.pthread_kill(main, signal.SIGINT)


def _warm_up(spark: Any, stack: StackConfig, say: Callable[[str], None]) -> None:
    """Load what every job's first steps load: a query's planning and codegen, the catalog,
    a Python worker (mapInArrow)."""
    try:
        spark.range(1000).selectExpr("sum(id)").collect()
        spark.sql(f"SHOW NAMESPACES IN {stack.catalog.name}").collect()
        spark.range(1).mapInArrow(lambda batches: batches, "id long").collect()
    except Exception as exc:  # a slower first job, not a failed driver
        say(f"warm-up incomplete: {exc}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-minutes", type=float, default=60.0)
    args = parser.parse_args(argv)

    from spark_jobs.conf import CONNECTORS_KEY, connectors_given
    from spark_jobs.session import get_session

    def say(text: str) -> None:
        # The driver's own stderr (its log), not the stream of the job it runs.
        line = f"[flow driver {time.strftime('%H:%M:%S')}] {text}"
        print(line, file=sys.__stderr__, flush=True)

    stack = StackConfig.from_env()
    started = time.monotonic()
    spark = get_session(stack, app_name="flow-warm-driver")
    _warm_up(spark, stack, say)
    conf = launch_conf(spark)
    master = conf.get("spark.master", "local[*]") or "local[*]"
    connectors = connectors_given(conf.get(CONNECTORS_KEY, None))
    server = _Server(spark, args.idle_minutes * 60, say)
    write_state(
        stack.home,
        DriverState(
            pid=os.getpid(),
            group=os.getpgid(0),
            port=server.port,
            token=server.token,
            master=master,
            connectors=None if connectors is None else sorted(connectors),
            stack=stack_fingerprint(stack, master),
            code=code_fingerprint(),
            started=time.time(),
            log=str(log_path(stack.home)),
        ),
    )
    say(f"ready in {time.monotonic() - started:.1f} s on 127.0.0.1:{server.port}")
    try:
        server.serve()
    finally:
        server.listener.close()
        recorded = read_state(stack.home)
        if recorded is not None and recorded.pid == os.getpid():
            state_path(stack.home).unlink(missing_ok=True)
        spark.stop()


if __name__ == "__main__":
    main()
