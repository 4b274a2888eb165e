"""The README's first command, in a reduced size: everything runs and the counts reconcile."""

from __future__ import annotations

import json
import shlex

import pytest

from flow.cli.lifecycle import demo
from flow.config import StackConfig
from flow.workflows.demo import DemoSize
from tests.support import run_flow


def test_the_demo_s_reproducing_command_gives_the_same_size() -> None:
    size = DemoSize(days=2, rate=250.5, live_s=60, trigger="2 seconds", labels="window")
    words = shlex.split(size.command())
    assert words[:2] == ["flow", "demo"]
    params = demo.make_context("demo", words[2:]).params
    again = DemoSize(
        days=params["days"],
        per_day=params["per_day"],
        rate=params["rate"],
        live_s=params["live_seconds"],
        drain_s=params["drain_seconds"],
        trigger=params["trigger"],
        per_batch=params["per_batch"],
        labels=params["labels"],
    )
    assert again == size


@pytest.mark.integration
def test_the_demo_runs_end_to_end_and_its_summary_reconciles(
    running_stack: StackConfig, stack_env: dict[str, str]
) -> None:
    args = ["demo", "--days", "1", "--per-day", "3000", "--rate", "50"]
    args += ["--live-seconds", "40", "--drain-seconds", "20"]
    done = run_flow([*args, "--json"], stack_env, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    backfill, live = summary["stages"]["backfill"], summary["stages"]["live"]
    assert backfill["reconciled"]
    assert live["reconciled"]
    assert backfill["rows_in"] == 3000
    assert live["dead_letters"] > 0, "the stream carries malformed records"
    assert summary["trained_rows"] == backfill["rows_out"] + live["rows_out"]
    assert 0.0 <= summary["auc"] <= 1.0  # a figure, not NaN (too little data here to learn much)
    assert summary["stages"]["live"]["labels"] == "immediate"
    # The default path runs the writer inside the streaming plan, tagged on the stage's run.
    assert live["writer"] == "inplan", live
    assert live["writer_reason"]
    assert live["relabelled"] > 0, "clicks came within the run: their impressions left again"
    # The oracle (the world's true click probability) is scored on the same rows.
    assert summary["live"]["oracle_auc"] is not None
    fresh = summary["freshness"]
    assert fresh["produced_to_committed"]["p50"] > 0
    assert fresh["produced_to_trained"]["p50"] is not None
    # The table a person reads (stderr) says the same as the JSON: one row per stage.
    rows = {
        stage: line
        for line in done.stderr.splitlines()
        for stage in ("backfill", "live")
        if f" {stage} " in line and "reconcile" in line
    }
    assert set(rows) == {"backfill", "live"}, done.stderr[-3000:]
    assert not any("do NOT" in line for line in rows.values())
