"""A trainer's process lifecycle: it dies with its launcher, holds its checkpoint folder alone,
and says in one line how it was stopped.

* **The launcher.** torchrun starts each rank in a session of its own, so a launcher killed
  with SIGKILL used to leave its ranks training, and writing checkpoints into the folder a
  restarted trainer uses. A rank started by torchrun asks Linux for SIGTERM when its parent
  dies (``PR_SET_PDEATHSIG``; torchrun starts ranks from its main thread, whose end is the
  process's), and :meth:`Launcher.check` refuses a checkpoint write once its parent is gone.
* **The lease.** Rank 0 holds an exclusive ``flock`` on ``trainer.lease`` in a local checkpoint
  folder for as long as it trains; a second trainer on the folder is refused in one line that
  names the holder. The kernel drops the lock with its process, however it ends: there is no
  stale lease to clear. An object-store folder (``s3://``) has no lock to take, and is not
  leased: two trainers there are not detected (the launcher check still holds).
* **Stopping.** SIGTERM and SIGINT unwind the trainer (MLflow runs end as KILLED) and end it
  with one line, ``trainer stopped by SIGTERM at step 180; the checkpoint of step 160 is
  kept``, and exit code 128 + the signal.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

import pyarrow.fs as pafs

from flow.console import Terminated
from flow.errors import ConfigError
from flow.storage import Location

__all__ = [
    "LEASE_FILE",
    "FolderInUseError",
    "Launcher",
    "LauncherGone",
    "Lease",
    "Stopped",
    "received",
    "stopping_on_signals",
]

LEASE_FILE = "trainer.lease"
"""The file in a local checkpoint folder whose lock rank 0 holds while it trains."""

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_LAUNCHED_BY = "TORCHELASTIC_RUN_ID"
"""Set by torchrun in every rank it starts (and by nothing else)."""


class LauncherGone(KeyboardInterrupt):
    """The rank's launcher died: the rank stops, as for a signal (its runs end as KILLED)."""

    def __init__(self, launcher: int) -> None:
        super().__init__(f"its launcher (pid {launcher}) is gone")
        self.launcher = launcher


@dataclass(frozen=True)
class Launcher:
    """The process that started this rank (torchrun's agent), or None for a trainer started on
    its own."""

    pid: int | None

    @classmethod
    def of_this_rank(cls, environ: Mapping[str, str] = os.environ) -> Launcher:
        """Watch the launcher of a rank torchrun started: SIGTERM when it dies (Linux). A rank
        whose launcher died before this (its parent is already init) stops at once."""
        if _LAUNCHED_BY not in environ:
            return cls(None)
        _die_with_parent(signal.SIGTERM)
        parent = os.getppid()
        if parent == 1:  # reparented before the death signal was asked for
            raise LauncherGone(parent)
        return cls(parent)

    def gone(self) -> bool:
        return self.pid is not None and os.getppid() != self.pid

    def check(self) -> None:
        """Raise :class:`LauncherGone` if the launcher died: called before every checkpoint
        write, in case its death signal has not been delivered yet."""
        if self.pid is not None and self.gone():
            raise LauncherGone(self.pid)


def _die_with_parent(signum: int) -> None:
    if not sys.platform.startswith("linux"):
        return  # elsewhere only Launcher.check guards the checkpoints
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


class FolderInUseError(ConfigError):
    """The checkpoint folder is another trainer's: every rank of a run raises it, rank 0 says it."""


class Lease:
    """Rank 0's exclusive hold on a local checkpoint folder; :meth:`release` (or the process's
    end) lets it go."""

    def __init__(self, path: Path, held: IO[str]) -> None:
        self.path = path
        self._held = held

    @classmethod
    def take(cls, folder: Location) -> Lease | None:
        """The folder's lease, or a ConfigError naming the trainer that holds it; None for a
        folder that is not on a local disk (nothing to lock there)."""
        if not isinstance(folder.fs, pafs.LocalFileSystem):
            return None
        path = Path(folder.path) / LEASE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        held = path.open("a+")  # "a+": the holder's record is not truncated before the lock
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held.seek(0)
            holder = _holder(held.read())
            held.close()
            raise FolderInUseError(
                f"checkpoint folder {folder} is in use by {holder}; stop it or give "
                "another --checkpoint-dir"
            ) from None
        held.seek(0)
        held.truncate()
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        }
        held.write(json.dumps(record))
        held.flush()
        return cls(path, held)

    def release(self) -> None:
        if not self._held.closed:
            self._held.close()  # closing the file drops its lock


def _holder(text: str) -> str:
    """Who holds a lease, from its record (which a holder writes just after locking)."""
    try:
        record = json.loads(text)
        return f"trainer pid {record['pid']} on host {record['host']} (started {record['started']})"
    except (ValueError, KeyError, TypeError):
        return "another trainer"


class Stopped(KeyboardInterrupt):
    """A trainer stopped by a signal or by its launcher's death, with its one line."""

    def __init__(self, line: str, code: int) -> None:
        super().__init__(line)
        self.line = line
        self.code = code


_received: list[signal.Signals] = []


def received() -> signal.Signals | None:
    """The stop signal this process received (None: none), whatever the code it interrupted
    raised: a rank whose peer stopped first sees its collectives fail."""
    return _received[0] if _received else None


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[None]:
    """SIGTERM raises :class:`~flow.console.Terminated` and SIGINT KeyboardInterrupt in the main
    thread while inside, so ``with`` and ``finally`` blocks run (MLflow runs end as KILLED);
    either is remembered for :func:`received`. Elsewhere than the main thread: nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()

    def stop(signum: int, _frame: FrameType | None) -> None:
        if not _received:
            _received.append(signal.Signals(signum))
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise Terminated(f"{signal.Signals(signum).name} received")
        # A second signal while unwinding: the first one's unwinding goes on undisturbed.

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
