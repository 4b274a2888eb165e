"""The demo's end screen: one table of the stages, a legend that defines each figure once, and
the status its ticker gives while it runs."""

from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

from rich.console import Console

from flow.config import StackConfig
from flow.handoff import Channel
from flow.storage import namespace_locations
from flow.workflows.demo import DemoStatus
from flow.workflows.demo_summary import LEGEND, show
from tests.support import stack_env_for
from tests.trainers.channels import write

SUMMARY: dict[str, Any] = {
    "parent_run": "0123",
    "stages": {
        "backfill": {
            "rows_in": 60_000, "rows_out": 58_800, "dead_letters": 1_200, "pending": 0,
            "relabelled": 0, "labels_unmatched": 0, "reconciled": True, "labels": "window",
            "seconds": 52.3, "writer": "", "writer_reason": "",
        },
        "live": {
            "rows_in": 240_000, "rows_out": 247_000, "dead_letters": 4_800, "pending": 310,
            "relabelled": 12_000, "labels_unmatched": 3, "reconciled": True,
            "labels": "immediate", "seconds": 331.0, "writer": "inplan", "writer_reason": "-",
        },
    },
    "auc": 0.801, "logloss": 0.2101,
    "backfill": {
        "auc": 0.79, "logloss": 0.2, "frozen_auc": None, "oracle_auc": 0.85,
        "oracle_logloss": 0.19, "oracle_rate": 0.05, "true_rate": 0.048, "positive_rate": 0.049,
        "calibration": 1.02,
    },
    "live": {
        "auc": 0.812, "logloss": 0.1703, "frozen_auc": 0.781, "oracle_auc": 0.855,
        "oracle_logloss": 0.1804, "oracle_rate": 0.05, "true_rate": 0.048,
        "positive_rate": 0.047, "calibration": 0.97,
    },
    "samples_per_s": 2_100.0, "data_stall_fraction": 0.62, "trained_rows": 305_800,
    "freshness": {
        "produced_to_committed": {"p50": 3.2, "p99": 8.1},
        "produced_to_trained": {"p50": 5.0, "p99": 12.0},
        "event_to_trained": {"p50": 5.5, "p99": 14.0},
    },
    "ui": "http://127.0.0.1:5000/#/experiments/1/runs/0123",
}  # fmt: skip


def screen(summary: dict[str, Any], pointers: list[tuple[str, str]] | None = None) -> str:
    shown = io.StringIO()
    show(summary, Console(width=120, file=shown, color_system=None), pointers or [])
    return shown.getvalue()


def row(text: str, figure: str) -> list[str]:
    """The cells of the table's row for ``figure``."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if cells and cells[0] == figure:
            return cells[1:]
    raise AssertionError(f"no row {figure!r} in:\n{text}")


def test_one_table_has_a_column_per_stage_and_a_row_per_figure() -> None:
    text = screen(SUMMARY)
    assert text.count("┏") == 1, "one table"
    header = next(line for line in text.splitlines() if line.startswith("┃"))
    assert [c.strip() for c in header.strip("┃").split("┃")] == ["", "backfill", "live"]
    assert row(text, "rows in") == ["60,000", "240,000"]
    assert row(text, "training rows") == ["58,800", "247,000 (+12,000 again)"]
    assert row(text, "counts") == ["reconcile", "reconcile"]
    assert row(text, "stage time") == ["52 s", "331 s"]
    assert row(text, "AUC") == ["0.790", "0.812"]
    assert row(text, "frozen AUC") == ["-", "0.781"]  # the backfill has no frozen model
    assert row(text, "oracle log loss") == ["0.1900", "0.1804"]
    assert row(text, "produced -> trained") == ["-", "p50 5.0 s, p99 12.0 s"]
    assert "waiting for data 62% of the time" in text


def test_every_figure_is_defined_once_in_the_legend_under_the_table() -> None:
    text = screen(SUMMARY)
    names = [name for name, _ in LEGEND]
    assert len(names) == len(set(names))
    legend = text[text.index("What the figures are") :]
    assert text.index("What the figures are") > text.index("└"), "the legend is under the table"
    for name, meaning in LEGEND:
        assert legend.count(f"\n{name} ") == 1, name
        assert meaning.split()[0] in legend
    # What a reader asked about: each has its line.
    for asked in ("calibration", "oracle", "frozen", "freshness", "waiting for data", "labels"):
        assert asked in names
    assert any(name.startswith("log loss < oracle") for name in names)


def test_a_stage_that_does_not_reconcile_says_so_and_missing_figures_are_dashes() -> None:
    broken = copy.deepcopy(SUMMARY)
    broken["stages"]["live"]["reconciled"] = False
    broken["live"] = {}
    broken["freshness"]["produced_to_committed"] = {}
    del broken["stages"]["backfill"]
    text = screen(broken)
    assert row(text, "counts") == ["-", "do NOT reconcile"]
    assert row(text, "AUC") == ["0.790", "-"]
    assert row(text, "produced -> committed") == ["-", "-"]
    assert "None" not in text
    assert "n/a" not in text


def test_where_things_are_comes_after_the_legend_each_on_one_line() -> None:
    link = SUMMARY["ui"] + "?" + "x" * 150  # longer than the screen: copied whole all the same
    text = screen(SUMMARY, [("MLflow", link), ("reproduce", "flow demo --days 1")])
    assert text.index(link) > text.index("What the figures are")
    assert f"MLflow     {link}" in text.splitlines()
    assert "reproduce  flow demo --days 1" in text.splitlines()


def test_the_status_says_the_phase_then_how_far_each_channel_and_the_trainer_are(
    tmp_path: Path,
) -> None:
    stack = StackConfig.from_env(stack_env_for(tmp_path / "home"))
    clock = iter([0.0, 75.0, 80.0, 90.0]).__next__
    status = DemoStatus(stack, "demo", clock=clock)
    status.phase = "writing the history to Iceberg"
    assert status() == "writing the history to Iceberg, 1 min 15 s in"
    status.phase, status.following = "Spark job and trainer", True
    assert status().endswith("the Spark job is starting (JVM, session, the history's first read)")
    where = Path(namespace_locations(stack, "demo").handoff.uri.removeprefix("file://"))
    write(where, "backfill", [300, 200], buckets=1)
    Channel(str(where), "backfill").close()
    said = "Spark job and trainer, 1 min 30 s in; backfill: 2 commits, 500 rows (closed)"
    assert status() == said
