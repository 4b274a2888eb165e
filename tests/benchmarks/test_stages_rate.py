"""The live yardstick's input count (benchmarks/stages.py): records read, not rows scanned."""

from __future__ import annotations

import json
from collections.abc import Callable
from types import ModuleType

import pytest


@pytest.fixture
def stages(benchmark: Callable[[str], ModuleType]) -> ModuleType:
    pytest.importorskip("pyspark")
    return benchmark("stages")


def _progress(rows: int, start: dict[str, dict[str, int]] | None, end: dict[str, dict[str, int]]):
    source = {
        "description": "KafkaV2[Subscribe[bench.impressions]]",
        "numInputRows": rows,
        "startOffset": json.dumps(start) if start is not None else None,
        "endOffset": json.dumps(end),
    }
    return {"numInputRows": rows, "sources": [source]}


def test_a_topic_scanned_twice_counts_each_record_once(stages: ModuleType) -> None:
    # The hand-written immediate job scans the impressions twice: Spark reports 100,000 rows
    # for 50,000 records.
    progress = _progress(
        100_000,
        {"bench.impressions": {"0": 25_000, "1": 25_000}},
        {"bench.impressions": {"0": 50_000, "1": 50_000}},
    )
    assert stages.records_read(progress) == 50_000


def test_the_first_batch_falls_back_on_spark_s_count(stages: ModuleType) -> None:
    assert stages.records_read(_progress(7, None, {"t": {"0": 7}})) == 7


def test_several_topics_add_up(stages: ModuleType) -> None:
    progress = _progress(0, {"a": {"0": 1}}, {"a": {"0": 4}})
    clicks = {
        "description": "c",
        "numInputRows": 2,
        "startOffset": '{"b": {"0": 0}}',
        "endOffset": '{"b": {"0": 2}}',
    }
    progress["sources"].append(clicks)
    assert stages.records_read(progress) == 5
