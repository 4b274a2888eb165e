"""A warm Spark driver that ``flow run`` hands its jobs to: ``flow driver start``.

A small ``flow run`` spends most of its time starting a driver (JVM, SparkContext, the first
query, the catalog), not working (docs/benchmarks.md, short jobs). ``flow driver start``
launches one driver with ``flow submit``'s settings (``spark_jobs/warm.py`` under spark-submit)
and leaves it running; while it is up, ``flow run APP.py`` sends it the job instead of starting
a driver of its own. The driver runs the application file in its own Python process, as
spark-submit would (``__main__``, ``sys.argv``, the caller's folder and ``FLOW_*``/``MLFLOW_*``
variables), in a new Spark session of its own (SQL settings, temporary views and UDFs are the
job's), and streams the job's output back; the exit code is the job's.

A job goes to the warm driver only when nothing would differ from a driver of its own: the
same stack (``FLOW_*`` settings) and master, the connectors the job needs among those the
driver has, the same ``flow``/``spark_jobs`` code, and no spark-submit options on the command
line. Otherwise (or while it runs another job) ``flow run`` says why in one line and starts its
own driver as before.

The wire: length-prefixed JSON over a loopback TCP socket. The address and a random token are
in ``$FLOW_HOME/driver/driver.json``, readable by this user only; a connection that does not
present the token first is dropped. No pickle crosses the socket.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flow.config import LOOPBACK, StackConfig
from flow.engine import Launch
from flow.errors import FlowError

__all__ = [
    "DRIVER_DIR",
    "DriverState",
    "JobRequest",
    "code_fingerprint",
    "find_driver",
    "job_env",
    "read_message",
    "run_on_driver",
    "send_message",
    "stack_fingerprint",
    "start_driver",
    "stop_driver",
    "write_state",
]

DRIVER_DIR = "driver"
"""The warm driver's folder in ``$FLOW_HOME``: its state file and its log."""
STATE_FILE = "driver.json"
_HEADER = struct.Struct(">I")
_MAX_MESSAGE = 64 << 20
_PACKAGES = ("flow", "spark_jobs")
"""The packages whose code a warm driver has loaded for good (a job's own modules it drops)."""
_JOB_ENV_PREFIXES = ("FLOW_", "MLFLOW_")
"""The variables a job takes from whoever sent it (the rest are the driver's own)."""
EXIT_LOST = 1
"""The exit code of a job whose driver ended before it did."""


def state_path(home: Path) -> Path:
    return home / DRIVER_DIR / STATE_FILE


def log_path(home: Path) -> Path:
    return home / DRIVER_DIR / "driver.log"


# --- the wire ---------------------------------------------------------------------------------


def send_message(sock: socket.socket, message: Mapping[str, Any]) -> None:
    data = json.dumps(message).encode()
    sock.sendall(_HEADER.pack(len(data)) + data)


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            raise EOFError("the other side closed the connection")
        chunks += chunk
    return bytes(chunks)


def read_message(sock: socket.socket) -> dict[str, Any]:
    """The next message; EOFError when the connection is closed."""
    (size,) = _HEADER.unpack(_read_exactly(sock, _HEADER.size))
    if size > _MAX_MESSAGE:
        raise EOFError(f"a message of {size} bytes: not this protocol")
    message = json.loads(_read_exactly(sock, size))
    if not isinstance(message, dict):
        raise EOFError("a message that is not a JSON object: not this protocol")
    return message


# --- what must match --------------------------------------------------------------------------


def code_fingerprint() -> str:
    """The ``flow`` and ``spark_jobs`` code as loaded: every module file's name, size and time.

    A driver started before an edit (or an upgrade) runs the old code: its jobs would not be
    what ``flow run`` runs cold."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for package in _PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            stat = path.stat()
            digest.update(f"{path.relative_to(root)}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def stack_fingerprint(stack: StackConfig, master: str) -> str:
    """The stack's settings (credentials included, hashed) and the master a driver runs on."""
    settings = json.dumps(asdict(stack), sort_keys=True, default=str)
    return hashlib.sha256(f"{settings}|{master}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class DriverState:
    """What ``driver.json`` says of a running warm driver."""

    pid: int
    """The driver's Python process (the server)."""
    group: int
    """The process group of its spark-submit (JVM and Python): what ``stop`` signals last."""
    port: int
    token: str
    master: str
    connectors: list[str] | None
    """The connectors beside Iceberg's on its classpath (None: all)."""
    stack: str
    code: str
    started: float
    log: str

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def refusal(
        self, stack: StackConfig, master: str, connectors: frozenset[str] | None
    ) -> str | None:
        """Why a job of ``stack`` on ``master`` needing ``connectors`` cannot run here (None:
        it can)."""
        if self.master != master:
            return f"it runs on {self.master}, the job on {master}"
        if self.stack != stack_fingerprint(stack, master):
            return "it was started with other FLOW_* settings"
        if self.connectors is not None:
            needed = set(connectors) if connectors is not None else {"every connector"}
            missing = sorted(needed - set(self.connectors))
            if missing:
                return f"it has no {', '.join(missing)} jars (flow driver start --connectors)"
        if self.code != code_fingerprint():
            return "flow's code changed since it started (flow driver restart)"
        return None


def write_state(home: Path, state: DriverState) -> Path:
    """``driver.json``, created readable by this user only and moved into place whole."""
    path = state_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        json.dump(asdict(state), out, indent=2)
    os.replace(partial, path)
    return path


def read_state(home: Path) -> DriverState | None:
    """The state of a driver that is running (None: none started, or it has ended)."""
    path = state_path(home)
    try:
        state = DriverState(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return state if state.alive() else None


def find_driver(home: Path) -> DriverState | None:
    """The running warm driver of the stack in ``home``, if any (a stale state file is
    removed)."""
    state = read_state(home)
    if state is None:
        state_path(home).unlink(missing_ok=True)
    return state


def new_token() -> str:
    return secrets.token_hex(32)


def token_matches(given: object, expected: str) -> bool:
    return isinstance(given, str) and hmac.compare_digest(given, expected)


# --- a job ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRequest:
    """What the driver needs to run a job as spark-submit would in the caller's place."""

    argv: list[str]
    """The application file and its arguments."""
    cwd: str
    env: dict[str, str]
    """The caller's ``FLOW_*``/``MLFLOW_*`` variables (those it lacks the job does not see)."""


def job_env(extra: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a job takes from its caller: ``FLOW_*``/``MLFLOW_*``, and ``extra``."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if k.startswith(_JOB_ENV_PREFIXES)}
    env.update(extra)
    return env


def _connect(state: DriverState, timeout_s: float) -> socket.socket:
    sock = socket.create_connection((LOOPBACK, state.port), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def run_on_driver(
    state: DriverState,
    request: JobRequest,
    out: Callable[[str, int], None],
    connect_timeout_s: float = 10.0,
) -> int | str:
    """Run ``request`` on the driver; its exit code, or why it did not start there (a str:
    the driver is busy, or did not answer). ``out(text, fd)`` gets the job's output as it
    comes. Ctrl-C cancels the job on the driver (as it would stop a driver of its own)."""
    try:
        sock = _connect(state, connect_timeout_s)
        send_message(sock, {"token": state.token, "job": asdict(request)})
        first = read_message(sock)
    except (OSError, EOFError) as exc:
        return f"it did not answer ({exc})"
    if "busy" in first:
        sock.close()
        return f"it is running another job ({first['busy']})"
    if "refused" in first:
        sock.close()
        return str(first["refused"])
    sock.settimeout(None)
    cancelled = False
    try:
        message = first
        while True:
            if "out" in message:
                out(str(message["out"]), int(message.get("fd", 1)))
            elif "exit" in message:
                code = int(message["exit"])
                return 130 if cancelled and code == 0 else code
            try:
                message = read_message(sock)
            except KeyboardInterrupt:
                if cancelled:
                    raise
                cancelled = True
                out("flow: cancelling the job on the warm driver (Ctrl-C again: leave it)\n", 2)
                send_message(sock, {"cancel": True})
                message = {}
    except (OSError, EOFError):
        out(
            f"flow: the warm driver ended during the job; its log: {state.log}\n",
            2,
        )
        return EXIT_LOST
    finally:
        sock.close()


def stop_driver(home: Path, grace_s: float = 30.0) -> DriverState | None:
    """Stop the warm driver (asked first, then its processes signalled); the state of the one
    stopped (None: none was running)."""
    state = read_state(home)
    state_path(home).unlink(missing_ok=True)
    if state is None:
        return None
    # A driver that does not answer (hung, or mid-start) is signalled below instead.
    with contextlib.suppress(OSError), _connect(state, 5.0) as sock:
        send_message(sock, {"token": state.token, "stop": True})
    deadline = time.monotonic() + grace_s
    while state.alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(state.group, sig)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(1.0)
    return state


def describe(state: DriverState) -> str:
    connectors = "all" if state.connectors is None else ", ".join(state.connectors) or "none"
    age = time.time() - state.started
    return (
        f"pid {state.pid}, {state.master}, connectors beside Iceberg: {connectors}, "
        f"up {age / 60:.0f} min, log {state.log}"
    )


def app_argv(argv: Sequence[str]) -> list[str] | None:
    """``argv`` when it is an application and its arguments only (what a warm driver runs);
    None when spark-submit options come before the application."""
    if not argv or argv[0].startswith("-") or not argv[0].endswith(".py"):
        return None
    return list(argv)


def start_driver(
    home: Path,
    launch: Launch,
    say: Callable[[str], None],
    timeout_s: float = 300.0,
) -> DriverState:
    """Start ``launch`` (spark-submit of the warm driver) in the background, its output in
    ``driver.log``; its state once it serves. A driver that ends first raises a FlowError
    with the end of its log."""
    log = log_path(home)
    log.parent.mkdir(parents=True, exist_ok=True)
    state_path(home).unlink(missing_ok=True)
    started = time.monotonic()
    try:
        with log.open("ab") as out:
            process = subprocess.Popen(
                launch.argv,
                env={**os.environ, **launch.env},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a group of its own: Ctrl-C here does not reach it
            )
        last_said = started
        while True:
            state = read_state(home)
            if state is not None and state.group == process.pid:
                return state
            if process.poll() is not None:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
                raise FlowError(
                    f"the warm driver ended (exit {process.returncode}) before it served; the "
                    f"end of {log}:\n{tail}"
                )
            if time.monotonic() - started > timeout_s:
                os.killpg(process.pid, signal.SIGKILL)
                raise FlowError(
                    f"the warm driver did not serve within {timeout_s:.0f} s; see {log}"
                )
            if time.monotonic() - last_said > 10:
                say(f"starting the warm driver ({time.monotonic() - started:.0f} s)")
                last_said = time.monotonic()
            time.sleep(0.25)
    finally:
        # spark-submit has read its properties file by the time the driver serves (or ended).
        for path in launch.private_files:
            path.unlink(missing_ok=True)
