"""A live stage's per-batch metrics include how far its Kafka sources were behind."""

from __future__ import annotations

from spark_jobs.live.supervise import _kafka_lag


def test_lag_comes_from_the_kafka_sources_progress_and_the_worst_topic_wins() -> None:
    progress = {
        "sources": [
            {"metrics": {"maxOffsetsBehindLatest": "120", "avgOffsetsBehindLatest": "60.5"}},
            {"metrics": {"maxOffsetsBehindLatest": "7", "avgOffsetsBehindLatest": "3.5"}},
            {"description": "a source without metrics"},
        ]
    }
    assert _kafka_lag(progress) == {"kafka_lag_max": 120.0, "kafka_lag_avg": 60.5}
    assert _kafka_lag({"sources": []}) == {}
