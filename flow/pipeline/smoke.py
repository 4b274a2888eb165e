"""The stack smoke pipeline's definition: one run that touches every part of the stack.

pyiceberg writes a dimension table; a Kafka producer writes JSON events; a Spark Structured
Streaming query reads the topic, enriches each event from the Iceberg table and appends to an
Iceberg table; a Spark batch MERGEs per-user totals into a Delta table; pyiceberg and Spark read
everything back and the counts must reconcile; MLflow gets a parent run and a run per stage.
The Spark side lives in ``spark_jobs.smoke``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from flow.errors import ConfigError
from flow.pipeline.schema import Definition

__all__ = ["SmokeCheck"]

_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")


@dataclass(frozen=True)
class SmokeCheck(Definition):
    """What the smoke pipeline writes, and how much."""

    namespace: str = "smoke"
    """Iceberg namespace of the dimension and result tables."""
    topic: str = "smoke.events"
    """Kafka topic the events go through."""
    users: int = 50
    """Rows of the Iceberg dimension table written per run."""
    events: int = 2000
    """Events produced to Kafka per run."""
    delta_table: str = "smoke_user_totals"
    """Name of the Delta table (a folder under ``FLOW_LAKE``) holding per-user totals."""
    experiment: str = "primus-flow-smoke"
    """MLflow experiment of the runs."""

    def __post_init__(self) -> None:
        for name in ("namespace", "delta_table"):
            value = getattr(self, name)
            if not _IDENT.match(value):
                raise ConfigError(f"SmokeCheck.{name}={value!r}: use lower-case letters, digits, _")
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", self.topic):
            raise ConfigError(f"SmokeCheck.topic={self.topic!r} is not a legal Kafka topic name")
        if self.users < 1:
            raise ConfigError(f"SmokeCheck.users={self.users}: need at least one user")
        if self.events < 1:
            raise ConfigError(f"SmokeCheck.events={self.events}: need at least one event")
        if not self.experiment.strip():
            raise ConfigError("SmokeCheck.experiment is empty; name an MLflow experiment")
