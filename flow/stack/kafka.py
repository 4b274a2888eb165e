"""Kafka from Python: the small client-side helpers the services, generators and tests share."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from flow.config import KafkaConfig
from flow.errors import ServiceError

__all__ = ["admin", "broker_answers", "delete_topics", "ensure_topics", "producer"]

# librdkafka reports every refused connection at error level; while waiting for a broker to
# start that is expected, so the clients log through a logger that keeps only critical lines.
_quiet = logging.getLogger("flow.kafka.client")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


def _base(config: KafkaConfig) -> dict[str, Any]:
    return {"bootstrap.servers": config.bootstrap_servers, "logger": _quiet}


def admin(config: KafkaConfig) -> AdminClient:
    return AdminClient(_base(config))


def producer(config: KafkaConfig, **settings: Any) -> Producer:
    """A producer with safe defaults (idempotent, all acks); ``settings`` override them."""
    conf = _base(config) | {"enable.idempotence": True, "acks": "all", "linger.ms": 20}
    conf.update(settings)
    return Producer(conf)


def broker_answers(config: KafkaConfig, timeout: float = 2.0) -> int | None:
    """The number of brokers in the cluster metadata, or None when no broker answers."""
    try:
        metadata = admin(config).list_topics(timeout=timeout)
    except KafkaException:
        return None
    return len(metadata.brokers) or None


def ensure_topics(
    config: KafkaConfig,
    topics: Iterable[str],
    *,
    partitions: int = 1,
    settings: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> list[str]:
    """Create the topics that do not exist yet; return the names created."""
    client = admin(config)
    try:
        existing = set(client.list_topics(timeout=timeout).topics)
    except KafkaException as exc:
        raise ServiceError(
            f"Kafka at {config.bootstrap_servers} does not answer ({exc}); start it with "
            "`flow services up` or check FLOW_KAFKA_BOOTSTRAP"
        ) from exc
    wanted = [t for t in dict.fromkeys(topics) if t not in existing]
    if not wanted:
        return []
    futures = client.create_topics(
        [
            NewTopic(
                t, num_partitions=partitions, replication_factor=1, config=dict(settings or {})
            )
            for t in wanted
        ],
        operation_timeout=timeout,
    )
    created = []
    for name, future in futures.items():
        try:
            future.result(timeout=timeout)
            created.append(name)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise ServiceError(f"could not create Kafka topic {name!r}: {exc}") from exc
    return created


def delete_topics(config: KafkaConfig, topics: Iterable[str], timeout: float = 30.0) -> None:
    """Delete the topics that exist and wait until the broker no longer lists them."""
    client = admin(config)
    wanted = set(topics)
    existing = wanted & set(client.list_topics(timeout=timeout).topics)
    if not existing:
        return
    for future in client.delete_topics(sorted(existing), operation_timeout=timeout).values():
        future.result(timeout=timeout)
    deadline = time.monotonic() + timeout
    while wanted & set(client.list_topics(timeout=timeout).topics):
        if time.monotonic() > deadline:
            raise ServiceError(
                f"Kafka still lists {sorted(existing)} {timeout:.0f}s after deletion"
            )
        time.sleep(0.2)
