"""The links the project prints open MLflow's UI on the runs, in a real (headless) browser.

MLflow 3's UI opens in its GenAI mode (traces, evaluations, judges) unless told otherwise; a
fresh browser profile is what a new user has. The pages are rendered by Chromium with a virtual
time budget (the UI's JavaScript runs and its requests complete) and read as text from the DOM.
Set FLOW_UPDATE_SCREENSHOTS=1 to also write the screenshots in docs/images/.
"""

from __future__ import annotations

import html.parser
import itertools
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from mlflow.tracking import MlflowClient

from flow import stack as services
from flow.config import StackConfig
from flow.handoff import Channel, Commit
from flow.insight import channel_insight
from flow.tracking import EXPERIMENT_KIND_TAG, MACHINE_LEARNING_KIND, MlflowTracker
from tests.flow.test_insight import shifted
from tests.support import REPO, stack_env_for
from tests.trainers.channels import LAYOUT, SCHEMA, rows

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
SCREENSHOTS = REPO / "docs" / "images"


def _browser() -> str:
    chosen = os.environ.get("FLOW_CHROMIUM")
    names = (chosen,) if chosen else BROWSERS
    found = next(filter(None, map(shutil.which, names)), None)
    if found is None:
        pytest.skip(
            f"no Chromium to render MLflow's UI: none of {', '.join(names)} is on PATH "
            "(apt-get install chromium, or set FLOW_CHROMIUM to a Chrome or Chromium binary)"
        )
    return found


class _Text(html.parser.HTMLParser):
    """The text a person sees: every text node outside <script> and <style>."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: object) -> None:
        self._hidden += tag in ("script", "style")

    def handle_endtag(self, tag: str) -> None:
        self._hidden -= tag in ("script", "style")

    def handle_data(self, data: str) -> None:
        if not self._hidden and data.strip():
            self.parts.append(data.strip())


def _chromium(
    url: str, profile: Path, *output: str, size: str = "1400,900"
) -> subprocess.CompletedProcess[str]:
    browser = _browser()
    argv = [
        browser,
        "--headless",
        "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",  # a new user's browser: no mode remembered
        f"--window-size={size}",
        # Virtual time stands still while requests are pending: the UI renders with its data.
        "--virtual-time-budget=20000",
        *output,
        url,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def _page_text(url: str, profile: Path) -> list[str]:
    parser = _Text()
    parser.feed(_chromium(url, profile, "--dump-dom").stdout)
    return parser.parts


def _screenshot(url: str, profile: Path, name: str, size: str = "1400,900") -> None:
    if os.environ.get("FLOW_UPDATE_SCREENSHOTS") != "1":
        return
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    _chromium(url, profile, f"--screenshot={SCREENSHOTS / name}", size=size)


@pytest.fixture(scope="module")
def mlflow_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackConfig]:
    """A stack of its own with only MLflow up: these tests need no broker."""
    stack = StackConfig.from_env(stack_env_for(tmp_path_factory.mktemp("flow-home-ui")))
    try:
        (row,) = services.up(stack, ("mlflow",))
        if not row.healthy:
            pytest.fail(f"MLflow did not come up: {row}")
        yield stack
    finally:
        services.down(stack, ("mlflow",))


@pytest.mark.integration
def test_the_printed_links_open_the_runs_and_their_stages(
    mlflow_stack: StackConfig, tmp_path: Path
) -> None:
    _browser()  # skip before logging anything where no browser can check it
    uri = mlflow_stack.mlflow.tracking_uri
    tag = uuid.uuid4().hex[:8]
    tracker = MlflowTracker(uri, f"pipeline-ui-{tag}")
    # A second process (the trainer) nests its stage under the same parent through its own
    # tracker, named after an experiment of its own that must not be made.
    trainer = MlflowTracker(uri, f"trainer-ui-{tag}")
    with tracker.pipeline_run("ctr-ui-pipeline", params={"rows": 10}) as parent:
        with tracker.stage("backfill-ui-stage") as stage:
            stage.log_metrics({"rows_out": 10})
        with trainer.attach(parent.run_id), trainer.stage("train-ui-stage") as train:
            train.log_metrics({"auc": 0.75})

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment(tracker.experiment_id)
    assert experiment.tags[EXPERIMENT_KIND_TAG] == MACHINE_LEARNING_KIND
    assert client.get_experiment_by_name(f"trainer-ui-{tag}") is None, "an empty experiment"

    # The link a pipeline prints: its run, with the stages of both processes as child runs.
    run_link = tracker.runs_url(parent.run_id)
    page = _page_text(run_link, tmp_path / "profile-run")
    assert "ctr-ui-pipeline" in page, page
    assert "Child runs" in page, page
    assert {"backfill-ui-stage", "train-ui-stage"} <= set(page), page
    # "Model training" mode: the registry in the sidebar, none of the GenAI pages.
    assert "Model registry" in page, page
    assert not {"Evaluations", "Judges", "Evaluation runs"} & set(page), page

    # The experiment's runs table: the pipeline run, its two stages counted under it.
    table_link = tracker.runs_url()
    page = _page_text(table_link, tmp_path / "profile-table")
    assert "Runs" in page, page
    assert "ctr-ui-pipeline" in page, page
    assert "3 matching runs" in _joined(page), page
    assert not {"Training runs", "Judges", "Evaluation runs"} & set(page), page

    _screenshot(table_link, tmp_path / "profile-shot-table", "mlflow-runs.png")
    _screenshot(run_link, tmp_path / "profile-shot-run", "mlflow-run.png")


def _joined(parts: list[str]) -> list[str]:
    """Neighbouring text nodes joined in pairs: React splits "3 matching runs" in two."""
    return parts + [f"{a} {b}" for a, b in itertools.pairwise(parts)]


@pytest.mark.integration
def test_an_existing_experiment_without_a_kind_gets_the_machine_learning_kind(
    mlflow_stack: StackConfig,
) -> None:
    uri = mlflow_stack.mlflow.tracking_uri
    client = MlflowClient(tracking_uri=uri)
    untagged = client.create_experiment(f"untagged-{uuid.uuid4().hex[:8]}")
    chosen = client.create_experiment(
        f"chosen-{uuid.uuid4().hex[:8]}", tags={EXPERIMENT_KIND_TAG: "genai_development"}
    )
    for experiment_id in (untagged, chosen):
        name = client.get_experiment(experiment_id).name
        tracker = MlflowTracker(uri, name)
        with tracker.pipeline_run("p"):
            pass
        assert tracker.experiment_id == experiment_id
    assert client.get_experiment(untagged).tags[EXPERIMENT_KIND_TAG] == MACHINE_LEARNING_KIND
    # A kind someone chose is theirs.
    assert client.get_experiment(chosen).tags[EXPERIMENT_KIND_TAG] == "genai_development"


UNITS = {
    # As a pipeline stage records them (ChannelMeta.units): an age standardized, a price logged.
    "age": {"column": "age", "mean": 41.0, "std": 12.0, "log": False, "clip": None},
    "price": {"column": "price", "mean": 3.0, "std": 0.8, "log": True, "clip": None},
}


def _a_day(table: pa.Table, seed: int) -> pa.Table:
    """``table``'s rows spread over the 24 hours before now, the label rate rising through the
    day (as a stage's rows carry their event times)."""
    rng = np.random.default_rng(seed)
    n = table.num_rows
    hours = np.sort(rng.uniform(0, 24, n))
    now_us = int(np.datetime64("now", "us").astype(np.int64))
    event = pa.array(now_us - ((24 - hours) * 3600e6).astype(np.int64), pa.int64())
    label = (rng.random(n) < 0.25 + 0.2 * hours / 24).astype(np.float32)
    table = table.set_column(0, "label", pa.array(label))
    return table.set_column(3, "event_time", event.cast(pa.timestamp("us", tz="UTC")))


def test_an_insight_report_renders_its_plots_and_findings_in_a_browser(tmp_path: Path) -> None:
    """The report as MLflow's artifact view serves it: one HTML file, its plots inside it, the
    numbers in their raw units (the channel records its transform), the label rate by hour. A
    planted drift is the report's first finding; the plots are images that decode (Chromium
    gives a broken image no size)."""
    stack = StackConfig.from_env(stack_env_for(tmp_path / "home"))
    channel = Channel(str(tmp_path), "live")
    meta = channel.create(SCHEMA, num_buckets=1, layout=LAYOUT.to_dict(), units=UNITS)
    for batch_id, table in enumerate(
        [_a_day(rows(8000, seed=5), 1), _a_day(shifted(rows(8000, seed=6), by=1.0), 2)]
    ):
        shard = channel.write_bucket(batch_id, 0, table, "t0")
        channel.add_commit(Commit("live", batch_id, (shard,), meta.fingerprint))
    channel_insight(stack, str(tmp_path), "live", [0])
    _, folder = channel_insight(stack, str(tmp_path), "live", [1])
    page = (folder / "report.html").as_uri()
    dom = _chromium(page, tmp_path / "profile", "--dump-dom").stdout
    text = " ".join(_page_text(page, tmp_path / "profile-text"))
    assert "price drifted" in text
    table = text.split("(the values the trainer reads)")[1]  # past the legend that names both
    assert "as stored" not in table  # ages in years, prices in money
    assert "raw" in table
    assert dom.count("data:image/png;base64,") == 3
    _screenshot(page, tmp_path / "profile-shot", "insight-report.png", size="1200,1800")
