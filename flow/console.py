"""The terminal output of commands and jobs (rich), shared so it looks the same everywhere; and
how an error reaches the user.

A :class:`~flow.errors.FlowError` is a mistake with a message that says what to change: every
entry point (the ``flow`` CLI, ``python -m trainers``, a pipeline file under ``flow run`` or
spark-submit) prints it as ``error: ...`` on stderr and exits 1, without a traceback.
``--debug`` (or ``FLOW_DEBUG=1``, which reaches the processes a command starts) adds the
traceback. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType

from rich.console import Console

from flow.errors import FlowError

__all__ = [
    "DEBUG_ENV",
    "DEBUG_FLAG",
    "Terminated",
    "console",
    "debug_requested",
    "install_excepthook",
    "report_error",
    "reporting_errors",
    "terminating_as_interrupt",
]

DEBUG_ENV = "FLOW_DEBUG"
DEBUG_FLAG = "--debug"
_TRUE = frozenset({"1", "true", "yes", "on"})


def console() -> Console:
    """A stderr console; 120 columns when stderr is not a terminal (logs, CI), not rich's 80."""
    return Console(stderr=True, width=None if sys.stderr.isatty() else 120)


def debug_requested(argv: Sequence[str] | None = None) -> bool:
    """``--debug`` among ``argv`` (default: this process's arguments) or ``FLOW_DEBUG=1``."""
    args = sys.argv[1:] if argv is None else argv
    return DEBUG_FLAG in args or os.environ.get(DEBUG_ENV, "").strip().lower() in _TRUE


def report_error(error: FlowError, *, debug: bool = False) -> None:
    """``error: <message>`` on stderr; with ``debug``, the traceback before it."""
    if debug:
        traceback.print_exception(error)
    print(f"error: {error}", file=sys.stderr, flush=True)


@contextmanager
def reporting_errors(argv: Sequence[str] | None = None) -> Iterator[None]:
    """A FlowError inside becomes its one line and exit code 1 (see :func:`report_error`); a
    stop (Ctrl-C, or SIGTERM under :func:`terminating_as_interrupt`) one line and 130 / 143."""
    try:
        yield
    except FlowError as exc:
        report_error(exc, debug=debug_requested(argv))
        raise SystemExit(1) from None
    except KeyboardInterrupt as exc:
        if debug_requested(argv):
            traceback.print_exception(exc)
        terminated = isinstance(exc, Terminated)
        print(f"stopped: {exc if terminated else 'interrupted (Ctrl-C)'}", file=sys.stderr)
        raise SystemExit(128 + (signal.SIGTERM if terminated else signal.SIGINT)) from None


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, as Ctrl-C raises KeyboardInterrupt."""


@contextmanager
def terminating_as_interrupt() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the main thread while inside: ``with`` and
    ``finally`` blocks run (streaming queries stop, MLflow runs end as KILLED) where Python's
    default would end the process at once. Elsewhere than the main thread: nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum: int, _frame: object) -> None:
        raise Terminated(f"{signal.Signals(signum).name} received")

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def install_excepthook() -> None:
    """Report a FlowError that nothing caught as its one line (exit code 1, as for any uncaught
    error); other exceptions go to the hook that was there before.

    For pipeline files, whose definition is built at module level, before :func:`run_main`
    could catch anything: ``run_main(my_pipeline())``. Installing it twice changes nothing.
    """
    if getattr(sys.excepthook, "_flow_reports", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if isinstance(error, FlowError) and not debug_requested():
            report_error(error)
        else:
            previous(kind, error, tb)

    hook._flow_reports = True  # type: ignore[attr-defined]
    sys.excepthook = hook
