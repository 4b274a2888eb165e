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


def test_a_ratio_interval_holds_the_ratio_of_the_medians(stages: ModuleType) -> None:
    stage = [9_000.0, 7_500.0, 10_200.0, 8_100.0, 9_600.0]
    yardstick = [10_000.0, 9_900.0, 8_700.0, 11_000.0, 10_400.0]
    low, high = stages.ratio_interval(stage, yardstick)
    point = 9_000.0 / 10_000.0  # the medians' ratio
    assert low <= point <= high
    assert low < high
    # The same turns give the same interval (a fixed seed): a run's figure can be reproduced.
    assert stages.ratio_interval(stage, yardstick) == (low, high)


def test_turns_that_agree_leave_no_spread(stages: ModuleType) -> None:
    assert stages.ratio_interval([9.0, 9.0, 9.0], [10.0, 10.0, 10.0]) == (0.9, 0.9)


def test_turns_are_resampled_in_pairs(stages: ModuleType) -> None:
    # Each turn's stage ran beside its own yardstick: a slow turn slows both, and the pairs'
    # ratio (0.5 every turn) must not spread as unpaired draws would make it.
    low, high = stages.ratio_interval([5.0, 50.0, 500.0], [10.0, 100.0, 1000.0])
    assert (low, high) == (0.5, 0.5)


def test_an_interval_needs_a_rate_per_turn_for_both(stages: ModuleType) -> None:
    with pytest.raises(ValueError, match="one rate per turn"):
        stages.ratio_interval([1.0, 2.0], [1.0])
