"""What every local service offers: ``up``, ``down`` and a truthful ``status``.

:class:`Service` is the interface ``flow services`` drives. :class:`ManagedService` is the
lifecycle shared by the services that run as a background process of their own (the Kafka broker,
the MLflow server): status from the process record and a health probe, ``up`` that starts the
process when it is not running and waits until it answers, ``down`` that stops its whole process
tree. A subclass supplies only what differs: how to launch it, how to probe it, its ports.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal, Protocol

from flow.config import LOOPBACK
from flow.stack import process

__all__ = ["Launch", "ManagedService", "Progress", "Service", "ServiceState", "ServiceStatus"]

ServiceState = Literal["running", "stopped", "dead", "unresponsive", "external", "ready"]
"""``running``: process alive and answering. ``stopped``: no process and none expected.
``dead``: a process was started and is gone without ``down``. ``unresponsive``: alive but not
answering. ``external``: configured to use a service this project does not manage. ``ready``: a
service with no process of its own (the SQLite catalog) whose files are in place."""

Progress = Callable[[str], None]
"""Receives one-line progress messages while a service starts."""


@dataclass(frozen=True)
class ServiceStatus:
    """One service, as seen right now."""

    name: str
    state: ServiceState
    address: str
    pid: int | None = None
    detail: str = ""

    @property
    def healthy(self) -> bool:
        return self.state in ("running", "external", "ready")


class Service(Protocol):
    """A part of the local stack that ``flow services`` manages."""

    name: str

    def status(self) -> ServiceStatus: ...

    def up(self, progress: Progress) -> ServiceStatus: ...

    def down(self) -> ServiceStatus: ...


@dataclass(frozen=True)
class Launch:
    """How to start a managed service's process (in its folder, output to its log)."""

    command: Sequence[str]
    env: Mapping[str, str] | None = None
    """The whole environment of the process; None: this process's own."""


class ManagedService(ABC):
    """A service run as a background process: the lifecycle ``flow services`` drives."""

    name: str
    """Short name, as in ``flow services up kafka``."""
    title: ClassVar[str]
    """What it is in messages: "the Kafka broker"."""
    noun: ClassVar[str]
    """What answers once it is up: "broker" (kafka: broker answers after 4.1s)."""
    starts: ClassVar[str]
    """What is being started: "a KRaft broker" (kafka: starting a KRaft broker on ...)."""
    start_timeout_s: ClassVar[float]
    """How long ``up`` waits for the first answer before stopping it and failing."""
    stop_timeout_s: ClassVar[float]
    """How long ``down`` waits after SIGTERM before SIGKILL."""

    def __init__(self, folder: Path, log: Path) -> None:
        self.dir = folder
        self.log = log
        self.record_path = folder / "process.json"

    # -- what a service supplies ----------------------------------------------------------------

    @property
    @abstractmethod
    def address(self) -> str:
        """Where clients reach it."""

    @property
    @abstractmethod
    def managed(self) -> bool:
        """False when the settings point at an external service, never started or stopped here."""

    @abstractmethod
    def answers(self, timeout: float) -> bool:
        """The health probe: whether the local process serves requests."""

    @abstractmethod
    def ports(self) -> Sequence[tuple[int, str]]:
        """The local ports it listens on, each with the setting that chooses it."""

    @abstractmethod
    def prepare(self, progress: Progress) -> Launch:
        """Get everything in place for a start (files, jars) and say how to launch it."""

    def external_detail(self) -> str:
        """What ``status`` says about an external service."""
        return "answers" if self.answers(timeout=2.0) else "does not answer"

    # -- the shared lifecycle -------------------------------------------------------------------

    def status(self) -> ServiceStatus:
        if not self.managed:
            return ServiceStatus(self.name, "external", self.address, detail=self.external_detail())
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
        if self.answers(timeout=2.0):
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
            progress(f"{self.name}: pid {record.pid} is alive but not answering yet; waiting")
            self._wait(record, progress)
            return self.status()
        if current.state == "dead":
            progress(
                f"{self.name}: the previous {self.noun} (pid {current.pid}) had died; "
                "starting a new one"
            )
            self.record_path.unlink(missing_ok=True)

        # Ports first: a taken one fails at once, before jars are fetched or storage formatted.
        for port, setting in self.ports():
            process.ensure_port_free(LOOPBACK, port, setting, self.title)
        self.dir.mkdir(parents=True, exist_ok=True)
        launch = self.prepare(progress)
        progress(f"{self.name}: starting {self.starts} on {self.address}")
        record = process.spawn(launch.command, self.log, env=launch.env, cwd=self.dir)
        record.save(self.record_path)
        self._wait(record, progress)
        return self.status()

    def _wait(self, record: process.ProcessRecord, progress: Progress) -> None:
        waited = process.wait_ready(
            record,
            lambda: self.answers(timeout=1.0),
            service=f"{self.title} on {self.address}",
            timeout=self.start_timeout_s,
        )
        progress(f"{self.name}: {self.noun} answers after {waited:.1f}s")

    def down(self) -> ServiceStatus:
        if not self.managed:
            return self.status()
        record = process.ProcessRecord.load(self.record_path)
        if record is not None:
            process.stop(record, timeout=self.stop_timeout_s)
            self.record_path.unlink(missing_ok=True)
        return ServiceStatus(self.name, "stopped", self.address)
