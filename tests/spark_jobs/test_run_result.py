"""What a pipeline run writes for ``flow run --json`` (FLOW_RUN_RESULT): its MLflow run and
each ended stage's counts as the summary shows them; no Spark needed to check the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flow.config import RUN_RESULT_ENV, StackConfig
from flow.engine import RunOptions
from flow.pipeline import run as pipeline_run
from flow.tracking import NullTracker
from pipelines.ctr_backfill import ctr_backfill
from spark_jobs.report import StageReport
from spark_jobs.runner import _write_result


def _report(**counts: Any) -> StageReport:
    return StageReport("ctr_backfill", "backfill", "backfill", "backfill", **counts)


def test_the_result_holds_each_ended_stage_s_summary_row(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    tracker = NullTracker()
    with tracker.pipeline_run("ctr_backfill") as parent:
        _write_result(path, ctr_backfill(), tracker, parent, [])
        assert json.loads(path.read_text())["stages"] == []  # as the run starts
        reports = [
            _report(events_input=10, training_rows=7, events_dead=2, labels_dead=1, pending=0),
            _report(events_input=5, training_rows=3),
        ]
        _write_result(path, ctr_backfill(), tracker, parent, reports)
    written = json.loads(path.read_text())
    assert written["pipeline"] == "ctr_backfill"
    assert written["mlflow_run_id"] is None  # untracked
    first, second = written["stages"]
    assert first == {
        "stage": "backfill",
        "kind": "backfill",
        "channel": "backfill",
        "events_in": 10,
        "training_rows": 7,
        "dead_letters": 3,
        "pending": 0,
        "positives": 0,
        "seconds": 0.0,
        "reconciled": False,  # 10 in, 7 + 2 out
    }
    assert second["reconciled"] is False
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]  # no partial file left
    _write_result(None, ctr_backfill(), tracker, parent, reports)  # not asked for: nothing


def test_run_main_passes_the_file_flow_run_asked_for_to_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[RunOptions] = []

    class Engine:
        def run(self, spec: Any, stack: StackConfig, options: RunOptions) -> int:
            asked.append(options)
            return 0

    monkeypatch.setattr(pipeline_run, "load_engine", lambda name: Engine())
    monkeypatch.setenv("FLOW_HOME", str(tmp_path))
    monkeypatch.setenv(RUN_RESULT_ENV, str(tmp_path / "result.json"))
    with pytest.raises(SystemExit) as done:
        pipeline_run.run_main(ctr_backfill(), argv=["--no-tracking"])
    assert done.value.code == 0
    monkeypatch.delenv(RUN_RESULT_ENV)
    with pytest.raises(SystemExit):
        pipeline_run.run_main(ctr_backfill(), argv=[])
    assert [o.result_file for o in asked] == [tmp_path / "result.json", None]
    assert not asked[0].tracking
