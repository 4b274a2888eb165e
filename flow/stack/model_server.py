"""``mlflow models serve`` of a registered model on 127.0.0.1, for as long as a block runs.

The serving test and ``flow bench serve`` start it the same way: the local environment (the
model's own code travels with it; its packages are this environment's), one worker, a free
port. The server and its workers run in a session of their own, stopped together on exit.
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from flow.stack.process import spawn, stop, wait_ready

__all__ = ["model_server"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/ping", timeout=2) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def model_server(
    model_uri: str,
    *,
    tracking_uri: str | None,
    log: Path,
    port: int | None = None,
    workers: int = 1,
    timeout: float = 300.0,
) -> Iterator[str]:
    """``model_uri`` (``models:/NAME@ALIAS``, ``models:/NAME/VERSION``, ``runs:/...``) served
    on 127.0.0.1 until the block ends; its base URL (POST ``/invocations``).

    Waits until ``/ping`` answers (loading the model imports torch: seconds); a server that
    exits or is not up within ``timeout`` is a ServiceStartError with the tail of ``log``."""
    port = port or _free_port()
    command = [
        sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri,
        "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port), "-w", str(workers),
    ]  # fmt: skip
    env = dict(os.environ)
    # The server execs ``uvicorn`` by name: this environment's, also when it is not activated.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if tracking_uri:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    record = spawn(command, log, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(record, lambda: _answers(url), service="mlflow models serve", timeout=timeout)
        yield url
    finally:
        stop(record)
