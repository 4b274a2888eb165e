"""A live stage's per-batch lag: records past the batch's end offsets on the broker, and how old
its newest event was when the batch ended."""

from __future__ import annotations

import pytest

from spark_jobs.live.lag import batch_offsets, event_time_delay, records_behind


def test_end_offsets_come_from_every_kafka_source_of_the_progress() -> None:
    progress = {
        "sources": [
            {"endOffset": {"impressions": {"0": 120, "1": 7}}},
            {"endOffset": '{"clicks": {"0": 3}}'},  # as JSON text
            {"description": "a source without Kafka offsets", "endOffset": 41},
        ]
    }
    assert batch_offsets(progress) == {"impressions": {0: 120, 1: 7}, "clicks": {0: 3}}
    assert batch_offsets({"sources": []}) == {}


def test_records_behind_are_summed_and_the_worst_partition_named() -> None:
    end = {"impressions": {0: 120, 1: 7}, "clicks": {0: 3}}
    latest = {"impressions": {0: 150, 1: 7}, "clicks": {0: 13}}
    assert records_behind(end, latest) == {
        "kafka_lag": 40.0,
        "kafka_lag_max": 30.0,
        "kafka_lag_avg": 40 / 3,
    }


def test_a_caught_up_stage_is_zero_behind() -> None:
    end = {"impressions": {0: 150}}
    assert records_behind(end, end)["kafka_lag"] == 0.0
    # An offset the broker no longer knows (a deleted topic, recreated): never below 0.
    assert records_behind(end, {"impressions": {0: 10}})["kafka_lag"] == 0.0


def test_partitions_the_broker_did_not_answer_for_are_left_out() -> None:
    assert records_behind({"impressions": {0: 1}}, {}) == {}


def test_event_time_delay_runs_from_the_newest_event_to_the_batchs_end() -> None:
    progress = {
        "timestamp": "2026-11-28T10:00:00.000Z",
        "durationMs": {"triggerExecution": 156_000},
        "eventTime": {"max": "2026-11-28T09:59:30.000Z"},
    }
    assert event_time_delay(progress) == {"event_time_delay_s": pytest.approx(186.0)}
    assert event_time_delay({"timestamp": "2026-11-28T10:00:00.000Z", "eventTime": {}}) == {}
