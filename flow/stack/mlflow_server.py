"""The local MLflow tracking server: a SQLite store and an artifact folder, on 127.0.0.1.

Clients (Spark drivers, trainer ranks, the CLI) talk to it over HTTP rather than each opening the
SQLite file: one writer process serialises their writes, and it is the same shape as a shared
production server, so a tracking outage can be handled (and tested) the same way everywhere.
``flow ui`` opens its web UI.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

from flow.config import LOOPBACK, StackConfig
from flow.stack.service import Launch, ManagedService, Progress

__all__ = ["MlflowService", "mlflow_answers"]


def mlflow_answers(tracking_uri: str, timeout: float = 2.0) -> bool:
    """Whether an MLflow server answers its health check at ``tracking_uri``."""
    if not tracking_uri.startswith(("http://", "https://")):
        return False
    try:
        with urllib.request.urlopen(tracking_uri.rstrip("/") + "/health", timeout=timeout) as rsp:
            return bool(rsp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


class MlflowService(ManagedService):
    """``flow services`` for the tracking server."""

    name = "mlflow"
    title = "the MLflow server"
    noun = "server"
    starts = "the tracking server"
    start_timeout_s = 120.0
    stop_timeout_s = 15.0

    def __init__(self, stack: StackConfig) -> None:
        folder = stack.services_dir / "mlflow"
        super().__init__(folder, folder / "server.log")
        self.stack = stack
        self.config = stack.mlflow

    @property
    def address(self) -> str:
        return self.config.tracking_uri

    @property
    def managed(self) -> bool:
        return self.config.managed

    def answers(self, timeout: float) -> bool:
        return mlflow_answers(self.address, timeout=timeout)

    def ports(self) -> list[tuple[int, str]]:
        return [(self.config.port, "FLOW_MLFLOW_PORT")]

    def prepare(self, progress: Progress) -> Launch:
        self.config.artifacts.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        # MLflow 3 otherwise starts a job runner and seven huey consumers (~1.5 GB) for its
        # GenAI features; the tracking store and UI do not need them.
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        return Launch(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                f"sqlite:///{self.config.backend_store}",
                "--artifacts-destination",
                str(self.config.artifacts),
                "--host",
                LOOPBACK,
                "--port",
                str(self.config.port),
                "--workers",
                "1",
            ],
            env,
        )
