"""flow bench batch_anatomy: a micro-batch taken apart from a (made-up) Spark event log."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

STARTED_MS = 1_796_669_131_000
"""Batch 3's trigger, 2026-12-07T18:45:31Z."""


def _events() -> list[dict[str, Any]]:
    t = STARTED_MS
    props = {"streaming.sql.batchId": "3"}
    return [
        # A broadcast beside the main job, then the main job: stage 10, then the last, 11.
        {"Event": "SparkListenerJobStart", "Job ID": 1, "Submission Time": t + 700,
         "Properties": props, "Stage Infos": [{"Stage ID": 9}]},
        {"Event": "SparkListenerJobEnd", "Job ID": 1, "Completion Time": t + 750},
        {"Event": "SparkListenerJobStart", "Job ID": 2, "Submission Time": t + 900,
         "Properties": props, "Stage Infos": [{"Stage ID": 10}, {"Stage ID": 11}]},
        {"Event": "SparkListenerStageCompleted",
         "Stage Info": {"Stage ID": 10, "Submission Time": t + 900, "Completion Time": t + 1400}},
        {"Event": "SparkListenerStageCompleted",
         "Stage Info": {"Stage ID": 11, "Submission Time": t + 1400, "Completion Time": t + 2900}},
        {"Event": "SparkListenerTaskEnd", "Stage ID": 10,
         "Task Metrics": {"Executor Run Time": 400, "Executor CPU Time": 300_000_000}},
        {"Event": "SparkListenerTaskEnd", "Stage ID": 11,
         "Task Metrics": {"Executor Run Time": 1400, "Executor CPU Time": 500_000_000}},
        {"Event": "SparkListenerJobEnd", "Job ID": 2, "Completion Time": t + 2900},
        # A job of another query (no batch id) counts nowhere.
        {"Event": "SparkListenerJobStart", "Job ID": 3, "Submission Time": t + 1000,
         "Properties": {}, "Stage Infos": [{"Stage ID": 12}]},
        {"Event": "SparkListenerJobEnd", "Job ID": 3, "Completion Time": t + 9000},
        {"Event": "org.apache.spark.sql.streaming.StreamingQueryListener$QueryProgressEvent",
         "progress": {
             "batchId": 3, "timestamp": "2026-12-07T18:45:31.000Z",
             "durationMs": {"latestOffset": 20, "walCommit": 80, "getBatch": 0,
                            "queryPlanning": 400, "addBatch": 2600, "commitOffsets": 100,
                            "triggerExecution": 3200},
             "sources": [{"numInputRows": 7000}, {"numInputRows": 500}],
             "stateOperators": [{"operatorName": "symmetricHashJoin", "allUpdatesTimeMs": 300,
                                 "allRemovalsTimeMs": 200, "commitTimeMs": 100}],
         }},
    ]  # fmt: skip


@pytest.fixture
def bench(benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark("batch_anatomy")


def _log(folder: Path) -> Path:
    log = folder / "local-1796669131330"
    log.write_text("\n".join(json.dumps(e) for e in _events()) + "\n")
    return log


def test_a_batch_is_split_into_spark_s_steps_its_sink_s_jobs_and_its_state(
    bench: ModuleType, tmp_path: Path
) -> None:
    rows = bench.anatomy(bench.read_log(_log(tmp_path)), 0, 10)
    one = {name: values[0] for name, values in rows.items()}
    # The sink began 500 ms in (after the steps before it) and ended at 3,100 ms.
    assert one["sink: before its main job"] == 400
    assert one["  small jobs beside it, summed"] == 50
    assert one["sink: the main job"] == 2000
    assert (one["  its stages before the last"], one["  its last stage"]) == (500, 1500)
    assert (one["  task run time, all its stages"], one["  of which the JVM's CPU"]) == (1800, 800)
    assert one["sink: after its main job"] == 200
    assert one["records read"] == 7500
    assert one["state 0 symmetricHashJoin: allRemovalsTimeMs"] == 200


def test_batches_outside_the_range_are_left_out(bench: ModuleType, tmp_path: Path) -> None:
    assert bench.anatomy(bench.read_log(_log(tmp_path)), 4, 10) == {}
    with pytest.raises(SystemExit, match="no micro-batch with a job among batches 4-10"):
        bench.main([str(tmp_path), "--batches", "4-10"])


def test_a_compressed_log_is_refused_naming_the_setting(bench: ModuleType, tmp_path: Path) -> None:
    log = tmp_path / "events_1_local-1.zstd"
    log.write_bytes(b"\x28\xb5\x2f\xfd\x00\x00")
    with pytest.raises(SystemExit, match=r"spark\.eventLog\.compress=false"):
        bench.read_log(log)


def test_the_summary_saves_medians_from_the_folder_of_the_log(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOW_HOME", str(tmp_path / "home"))
    _log(tmp_path)
    result = bench.main([str(tmp_path), "--batches", "3"])
    assert result["figures"]["sink: the main job"] == {
        "median": 2000,
        "min": 2000,
        "max": 2000,
        "batches": 1,
    }
    assert list((tmp_path / "home" / "bench").glob("batch_anatomy-*.json"))
