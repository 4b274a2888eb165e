"""The embedded local stack: ``flow services up | down | status``.

Kafka (a KRaft broker in its own JVM), the Iceberg SQL catalog (SQLite) and MLflow (a tracking
server on SQLite), all on 127.0.0.1 with their state under ``$FLOW_HOME/services``. Services
configured as external (``FLOW_KAFKA_BOOTSTRAP``, ``FLOW_CATALOG_TYPE=rest``,
``MLFLOW_TRACKING_URI``) are checked, never started or stopped.
"""

from __future__ import annotations

from filelock import FileLock

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.stack.broker import KafkaService
from flow.stack.mlflow_server import MlflowService
from flow.stack.service import Progress, Service, ServiceStatus
from flow.stack.sql_catalog import CatalogService

__all__ = ["SERVICE_NAMES", "Service", "ServiceStatus", "down", "local_services", "status", "up"]

SERVICE_NAMES = ("kafka", "iceberg", "mlflow")


def local_services(stack: StackConfig, only: tuple[str, ...] = ()) -> list[Service]:
    """The services of ``stack`` in start order, or just those named in ``only``."""
    unknown = sorted(set(only) - set(SERVICE_NAMES))
    if unknown:
        raise ConfigError(
            f"unknown service(s) {', '.join(unknown)}; services: {', '.join(SERVICE_NAMES)}"
        )
    services: list[Service] = [KafkaService(stack), CatalogService(stack), MlflowService(stack)]
    return [s for s in services if not only or s.name in only]


def _noop(_: str) -> None:
    return None


def up(
    stack: StackConfig, only: tuple[str, ...] = (), progress: Progress = _noop
) -> list[ServiceStatus]:
    """Start what is not running; harmless when everything already is."""
    # Two `flow services up` at once would both find the broker stopped and start it twice.
    with FileLock(stack.services_dir / ".lock"):
        return [service.up(progress) for service in local_services(stack, only)]


def down(stack: StackConfig, only: tuple[str, ...] = ()) -> list[ServiceStatus]:
    """Stop the managed services and every process they started."""
    with FileLock(stack.services_dir / ".lock"):
        return [service.down() for service in reversed(local_services(stack, only))][::-1]


def status(stack: StackConfig, only: tuple[str, ...] = ()) -> list[ServiceStatus]:
    return [service.status() for service in local_services(stack, only)]
