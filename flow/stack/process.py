"""Background processes of the local services: start, find again, wait for, stop.

A service's process is started in a session of its own, detached from the terminal, with its
output in a log file. A JSON record beside the log keeps its pid *and* its start time: a pid
alone may be reused by an unrelated process after a crash or a reboot, and ``status`` must never
report somebody else's process as the broker.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from flow.errors import PortInUseError, ServiceStartError

__all__ = [
    "ProcessRecord",
    "alive",
    "ensure_port_free",
    "log_tail",
    "port_open",
    "spawn",
    "stop",
    "wait_ready",
]


@dataclass(frozen=True)
class ProcessRecord:
    """What is needed to find a started service process again."""

    pid: int
    create_time: float
    command: list[str]
    log: str
    started_at: float

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> ProcessRecord | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None


# Services started by this process. Holding their Popen objects keeps Python from warning that a
# running child was garbage-collected, and polling them reaps one that died, so a long-lived
# parent (a test session, a scheduler) does not collect zombies.
_children: dict[int, subprocess.Popen[bytes]] = {}


def alive(record: ProcessRecord) -> bool:
    """Whether the recorded process is still running (and is the same process)."""
    child = _children.get(record.pid)
    if child is not None and child.poll() is not None:
        del _children[record.pid]
        return False
    try:
        proc = psutil.Process(record.pid)
        # create_time is rounded differently across reads; a second of slack is plenty.
        same = abs(proc.create_time() - record.create_time) < 1.0
        return same and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def spawn(
    command: Sequence[str],
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ProcessRecord:
    """Start ``command`` detached, in its own session, with stdout and stderr in ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(command),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    _children[proc.pid] = proc
    try:
        create_time = psutil.Process(proc.pid).create_time()
    except psutil.Error:
        create_time = time.time()
    return ProcessRecord(proc.pid, create_time, list(command), str(log), time.time())


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _port_owner(port: int) -> str:
    with contextlib.suppress(psutil.Error):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
                if conn.pid:
                    with contextlib.suppress(psutil.Error):
                        proc = psutil.Process(conn.pid)
                        return f" by pid {conn.pid} ({' '.join(proc.cmdline())[:120]})"
                return ""
    return ""


def ensure_port_free(host: str, port: int, setting: str, service: str) -> None:
    """Raise :class:`PortInUseError` naming ``setting`` when ``host:port`` is taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            raise PortInUseError(
                f"{service} needs {host}:{port}, which is in use{_port_owner(port)}; stop that "
                f"process or set {setting} to a free port"
            ) from None


def log_tail(path: Path | str, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file, or a note that it is missing."""
    try:
        with Path(path).open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def wait_ready(
    record: ProcessRecord,
    ready: Callable[[], bool],
    *,
    service: str,
    timeout: float,
    tick: Callable[[float], None] | None = None,
) -> float:
    """Poll ``ready`` until it holds; fail fast, with the log's tail, if the process exits.

    Returns the seconds waited.
    """
    started = time.monotonic()
    while True:
        waited = time.monotonic() - started
        if ready():
            return waited
        if not alive(record):
            raise ServiceStartError(
                f"{service} exited while starting (pid {record.pid}). Last lines of "
                f"{record.log}:\n{log_tail(record.log)}"
            )
        if waited > timeout:
            stop(record)
            raise ServiceStartError(
                f"{service} did not become ready within {timeout:.0f}s and was stopped. Last "
                f"lines of {record.log}:\n{log_tail(record.log)}"
            )
        if tick:
            tick(waited)
        time.sleep(0.2)


def stop(record: ProcessRecord, timeout: float = 30.0) -> None:
    """Stop the process and everything in its session: SIGTERM, then SIGKILL after ``timeout``."""
    if not alive(record):
        return
    try:
        pgid = os.getpgid(record.pid)
    except ProcessLookupError:
        return
    members = _group_members(pgid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    _, still = psutil.wait_procs(members, timeout=timeout)
    if still:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        psutil.wait_procs(still, timeout=10)
    child = _children.pop(record.pid, None)
    if child is not None:
        child.wait(timeout=10)


def _group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
    return members
