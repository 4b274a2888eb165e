"""The README's first command, in a reduced size: everything runs and the counts reconcile."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

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
    args += ["--live-seconds", "30", "--drain-seconds", "15"]
    done = run_flow([*args, "--json"], stack_env, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    summary = json.loads(done.stdout)  # --json: the document alone on stdout
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

    # What a person reads (stderr with --json): one table, its legend, each line's source.
    said = done.stderr
    # The Spark driver's own table of the stages is not printed as well.
    assert said.count("┏") == 1, said[-6000:]
    assert "demo: each stage, and the model on its rows" in said
    counts = next(line for line in said.splitlines() if line.startswith("│ counts "))
    assert counts.count("reconcile") == 2
    assert "do NOT" not in counts
    assert "What the figures are" in said
    assert "calibration" in said[said.index("What the figures are") :]
    lines = said.splitlines()
    # (The services say nothing here: the test's stack is up before the demo starts.)
    for source in ("demo", "generator", "spark", "trainer"):
        assert any(f" {source:<9} | " in line for line in lines), source
    # The trainer's whole result is a file the terminal names, not a line of JSON.
    assert not any(line.lstrip().startswith(("trainer: {", '{"steps"')) for line in lines)
    assert max(len(line) for line in lines) < 5_000  # the JSON line was 28,000 characters
    result = json.loads(Path(summary["trainer_result"]).read_text())
    assert result["rows"] == summary["trained_rows"]
    assert any(summary["trainer_result"] in line for line in lines)
    # Known noise goes to the log file only; the log has every line of every process.
    log = Path(summary["log"]).read_text()
    assert "Current batch is falling behind" not in said
    assert "serialized using CloudPickle" not in said
    assert "only in the log: " in said
    assert " spark     | " in log
    assert " trainer   | " in log

    # flow insight after the demo: the live channel's numbers in raw units (years of age).
    profiles = sorted((running_stack.home / "insight").glob("*/live/*/profile.json"))
    numeric = json.loads(profiles[-1].read_text())["numeric"]
    assert numeric["user_age"]["raw"]
    assert 16 <= numeric["user_age"]["mean"] <= 90
