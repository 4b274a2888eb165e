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
from flow.stack import process
from flow.stack.service import Progress, ServiceStatus

__all__ = ["MlflowService", "mlflow_answers"]

_START_TIMEOUT_S = 120.0


def mlflow_answers(tracking_uri: str, timeout: float = 2.0) -> bool:
    """Whether an MLflow server answers its health check at ``tracking_uri``."""
    if not tracking_uri.startswith(("http://", "https://")):
        return False
    try:
        with urllib.request.urlopen(tracking_uri.rstrip("/") + "/health", timeout=timeout) as rsp:
            return bool(rsp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


class MlflowService:
    """``flow services`` for the tracking server."""

    name = "mlflow"

    def __init__(self, stack: StackConfig) -> None:
        self.stack = stack
        self.config = stack.mlflow
        self.dir = stack.services_dir / "mlflow"
        self.record_path = self.dir / "process.json"
        self.log = self.dir / "server.log"

    @property
    def address(self) -> str:
        return self.config.tracking_uri

    def status(self) -> ServiceStatus:
        if not self.config.managed:
            detail = "answers" if mlflow_answers(self.address) else "does not answer"
            return ServiceStatus(self.name, "external", self.address, detail=detail)
        record = process.ProcessRecord.load(self.record_path)
        if record is None:
            return ServiceStatus(self.name, "stopped", self.address)
        if not process.alive(record):
            return ServiceStatus(
                self.name,
                "dead",
                self.address,
                record.pid,
                f"pid {record.pid} is gone without `flow services down`; see {self.log}",
            )
        if mlflow_answers(self.address):
            return ServiceStatus(self.name, "running", self.address, record.pid)
        return ServiceStatus(
            self.name, "unresponsive", self.address, record.pid, f"not answering; see {self.log}"
        )

    def up(self, progress: Progress) -> ServiceStatus:
        current = self.status()
        if current.state in ("running", "external"):
            return current
        record = process.ProcessRecord.load(self.record_path)
        if current.state == "unresponsive" and record is not None:
            progress(f"mlflow: pid {record.pid} is alive but not answering yet; waiting")
            self._wait(record, progress)
            return self.status()
        if current.state == "dead":
            progress(f"mlflow: the previous server (pid {current.pid}) had died; starting anew")
            self.record_path.unlink(missing_ok=True)

        process.ensure_port_free(LOOPBACK, self.config.port, "FLOW_MLFLOW_PORT", "MLflow")
        self.config.artifacts.mkdir(parents=True, exist_ok=True)
        command = [
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
        ]
        env = dict(os.environ)
        # MLflow 3 otherwise starts a job runner and seven huey consumers (~1.5 GB) for its
        # GenAI features; the tracking store and UI do not need them.
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        progress(f"mlflow: starting the tracking server on {self.address}")
        record = process.spawn(command, self.log, env=env, cwd=self.dir)
        record.save(self.record_path)
        self._wait(record, progress)
        return self.status()

    def _wait(self, record: process.ProcessRecord, progress: Progress) -> None:
        waited = process.wait_ready(
            record,
            lambda: mlflow_answers(self.address, timeout=1.0),
            service=f"the MLflow server on {self.address}",
            timeout=_START_TIMEOUT_S,
        )
        progress(f"mlflow: server answers after {waited:.1f}s")

    def down(self) -> ServiceStatus:
        if not self.config.managed:
            return self.status()
        record = process.ProcessRecord.load(self.record_path)
        if record is not None:
            process.stop(record, timeout=15.0)
            self.record_path.unlink(missing_ok=True)
        return ServiceStatus(self.name, "stopped", self.address)
