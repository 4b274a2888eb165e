"""What every local service offers: ``up``, ``down`` and a truthful ``status``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = ["Progress", "Service", "ServiceState", "ServiceStatus"]

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
