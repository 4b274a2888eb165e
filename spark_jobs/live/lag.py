"""How far behind a live stage is after each micro-batch: Kafka records and event time.

Spark's Kafka source reports ``maxOffsetsBehindLatest`` against the latest offsets it fetched
when it *planned* the batch. Without ``maxOffsetsPerTrigger`` a batch reads up to those offsets,
so Spark says 0 for every batch, however long the batch then runs while producers keep writing
(a cluster's batches of 156 s, 54 s and 28 s at 300 records/s all read 0). The truth is asked of
the broker once the batch is done: :func:`records_behind` subtracts the batch's end offsets (its
progress's ``endOffset``) from the latest offsets the broker holds now (:class:`LatestOffsets`,
one admin client for the run, one request per poll for every partition).

The event-time delay is the batch's end less the newest event time its rows carried (its
progress's ``eventTime.max``, which Spark keeps for a query with a watermark; the label join has
one): how old the freshest event was when the batch's rows were written.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

from flow.config import KafkaConfig
from flow.errors import FlowError
from flow.stack.kafka import admin

__all__ = [
    "LatestOffsets",
    "Offsets",
    "OffsetsUnknownError",
    "batch_offsets",
    "epoch_seconds",
    "event_time_delay",
    "records_behind",
]

Offsets = dict[str, dict[int, int]]
"""Offsets by topic, then partition."""


def batch_offsets(progress: Mapping[str, Any]) -> Offsets:
    """The end offsets of a batch's Kafka sources, from its progress (``endOffset``, which Spark
    writes as JSON or, in an older progress, as JSON text)."""
    found: Offsets = {}
    for source in progress.get("sources") or []:
        end = source.get("endOffset")
        if isinstance(end, str):
            try:
                end = json.loads(end)
            except json.JSONDecodeError:
                continue
        if not isinstance(end, dict):
            continue
        for topic, partitions in end.items():
            if not isinstance(partitions, dict):
                continue  # not a Kafka source's offsets
            for partition, offset in partitions.items():
                found.setdefault(str(topic), {})[int(partition)] = int(offset)
    return found


def records_behind(end: Offsets, latest: Offsets) -> dict[str, float]:
    """Records each partition holds past ``end``: their sum (``kafka_lag``), the worst partition
    (``kafka_lag_max``) and the mean (``kafka_lag_avg``); nothing for a batch read no Kafka
    partition, or for partitions the broker did not answer for."""
    behind = [
        max(0, latest[topic][partition] - offset)
        for topic, partitions in end.items()
        for partition, offset in partitions.items()
        if partition in latest.get(topic, {})
    ]
    if not behind:
        return {}
    return {
        "kafka_lag": float(sum(behind)),
        "kafka_lag_max": float(max(behind)),
        "kafka_lag_avg": sum(behind) / len(behind),
    }


def event_time_delay(progress: Mapping[str, Any]) -> dict[str, float]:
    """Seconds from the newest event time among the batch's rows to the batch's end
    (``event_time_delay_s``); nothing where Spark keeps no event times (no watermark) or the
    batch had no rows."""
    newest = (progress.get("eventTime") or {}).get("max")
    if not newest:
        return {}
    started = epoch_seconds(progress["timestamp"])
    ended = started + float((progress.get("durationMs") or {}).get("triggerExecution", 0)) / 1000
    return {"event_time_delay_s": max(0.0, ended - epoch_seconds(newest))}


def epoch_seconds(timestamp: str) -> float:
    """Spark's progress time (``2026-11-28T10:07:30.491Z``) as seconds since the epoch."""
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


class LatestOffsets:
    """The latest offsets of Kafka partitions, asked of the broker: one admin client for a run
    (made at the first ask), one request for all partitions."""

    def __init__(self, kafka: KafkaConfig, timeout_s: float = 10.0) -> None:
        self.kafka, self.timeout_s = kafka, timeout_s
        self._client: Any = None

    def __call__(self, partitions: Iterable[tuple[str, int]]) -> Offsets:
        """The latest offset of each ``(topic, partition)``; :class:`OffsetsUnknownError` when
        the broker does not answer."""
        spec = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        asked = {TopicPartition(t, p): spec for t, p in partitions}
        if not asked:
            return {}
        if self._client is None:
            self._client = admin(self.kafka)
        found: Offsets = {}
        try:
            futures = self._client.list_offsets(asked, request_timeout=self.timeout_s)
            for tp, future in futures.items():
                found.setdefault(tp.topic, {})[tp.partition] = int(future.result().offset)
        except KafkaException as exc:
            raise OffsetsUnknownError(
                f"Kafka at {self.kafka.bootstrap_servers} did not give its latest offsets ({exc})"
            ) from exc
        return found


class OffsetsUnknownError(FlowError):
    """The broker did not answer for its latest offsets: the batch's lag is not known."""
