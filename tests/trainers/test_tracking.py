"""The trainer's runs in MLflow: nested under the pipeline run, metrics, a registered model; a
hung tracking server does not stop training."""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace
from pathlib import Path

import mlflow
import psutil
import pytest
from mlflow.tracking import MlflowClient

from flow import stack as services
from flow.config import StackConfig
from flow.tracking import MlflowTracker
from flow.training import OptimConfig
from tests.trainers.channels import LAYOUT, write
from tests.trainers.test_train import config
from trainers.export import example_frame
from trainers.train import train


@pytest.mark.integration
def test_trainer_runs_nest_under_the_pipeline_run_and_register_the_model(
    running_stack: StackConfig, tmp_path: Path
) -> None:
    write(tmp_path, "train", [2000, 2000])
    write(tmp_path, "heldout", [1000], seed=5)
    experiment = f"test-trainer-{uuid.uuid4().hex[:8]}"
    name = f"ctr-{uuid.uuid4().hex[:6]}"
    uri = running_stack.mlflow.tracking_uri
    tracker = MlflowTracker(uri, experiment)
    with tracker.pipeline_run("pipeline") as parent:
        parent_id = parent.run_id
    cfg = config(
        tmp_path,
        eval_channel="heldout",
        tracking=True,
        experiment=experiment,
        parent_run_id=parent_id,
        register_as=name,
        log_every=5,
    )
    result = train(cfg, tracking_uri=uri, say=lambda _: None)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == {"pipeline", "train", "evaluate"}
    for stage in ("train", "evaluate"):
        assert runs[stage].data.tags["mlflow.parentRunId"] == parent_id
    trained = runs["train"].data
    assert trained.params["model"] == "dlrm"
    assert trained.params["world_size"] == "1"
    # Every setting in effect, defaults applied (issue 48): early stopping is on with the
    # eval channel, and the train run's last eval_* are the kept model's, as evaluate's are.
    for param in ("epochs", "eval_channel", "namespace", "batch_size", "optim.lr", "seed"):
        assert param in trained.params, param
    assert trained.params["early_stop"] == "2"
    assert trained.params["eval_channel"] == "heldout"
    assert trained.metrics["eval_auc"] == pytest.approx(runs["evaluate"].data.metrics["auc"])
    for metric in ("loss", "samples_per_s", "data_stall_fraction", "progressive_auc"):
        assert metric in trained.metrics, metric
    assert trained.tags["lineage.train.commits"] == "0..1"
    assert trained.metrics["handoff_commits"] == 2
    artifacts = {a.path for a in client.list_artifacts(runs["train"].info.run_id)}
    assert {"handoff_commits.json", "schema.json", "layout.json"} <= artifacts
    history = client.get_metric_history(runs["train"].info.run_id, "loss")
    assert len(history) >= 3  # over time, not once
    assert runs["evaluate"].data.metrics["auc"] == pytest.approx(result.metrics["auc"])
    (version,) = client.search_model_versions(f"name='{name}'")
    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model(f"models:/{name}/{version.version}")
    inputs = model.metadata.signature.inputs.input_names()
    assert inputs == ["age", "price", "user", "item", "country"]
    frame = example_frame(LAYOUT)
    predictions = model.predict(frame)
    assert len(predictions) == len(frame)
    assert ((predictions > 0) & (predictions < 1)).all()


@pytest.mark.integration
def test_a_worse_model_is_not_promoted_and_the_champion_warm_starts_the_next(
    running_stack: StackConfig, tmp_path: Path
) -> None:
    write(tmp_path, "train", [3000, 3000])
    uri = running_stack.mlflow.tracking_uri
    name = f"ctr-{uuid.uuid4().hex[:6]}"
    base = config(
        tmp_path,
        tracking=True,
        experiment=f"test-promote-{uuid.uuid4().hex[:8]}",
        register_as=name,
        holdout_share=0.25,
        promote_margin=0.01,
        checkpoint_dir=None,
        epochs=2,
    )
    first = train(base, tracking_uri=uri, say=lambda _: None)
    assert first.decision is not None
    assert first.decision.promote, first.decision
    assert first.decision.reason == "no champion yet"
    assert first.metrics["count"] == 1500  # bucket 0 of 4: a quarter held out

    diverged = replace(base, optim=OptimConfig(lr=50.0), epochs=1)
    worse = train(diverged, tracking_uri=uri, say=lambda _: None)
    assert worse.decision is not None
    assert not worse.decision.promote
    assert "below the champion's" in worse.decision.reason
    client = MlflowClient(tracking_uri=uri)
    assert client.get_model_version_by_alias(name, "champion").version == first.model_version
    assert client.get_run(worse.run_id or "").data.tags["flow.promotion"] == "kept"
    # Each version says how it was judged, what it was trained on and by which run.
    for result, outcome in ((first, "promoted"), (worse, "kept")):
        assert result.decision is not None
        tags = client.get_model_version(name, result.model_version or "").tags
        assert tags["flow.promotion"] == outcome
        assert tags["flow.promotion.reason"] == result.decision.reason
        assert tags["flow.run_id"] == result.run_id
        assert tags["flow.channels"] == "train"
        assert tags["flow.commits.train"] == "0..1"
        assert tags["flow.inputs"] == "features"  # its channel recorded no raw features

    warm = train(replace(base, init_from_champion=True, epochs=1), tracking_uri=uri, say=print)
    assert warm.decision is not None
    assert warm.decision.promote, warm.decision
    assert client.get_model_version_by_alias(name, "champion").version == warm.model_version


class _Hang:
    """The MLflow server's processes stopped (SIGSTOP): its port still takes connections, and
    nothing answers them, the worst outage for a client that waits (each request runs to its
    timeout)."""

    def __init__(self, stack: StackConfig) -> None:
        (row,) = services.status(stack, ("mlflow",))
        assert row.pid is not None, row
        server = psutil.Process(row.pid)
        self.processes = [server, *server.children(recursive=True)]

    def start(self) -> None:
        for process in self.processes:
            process.suspend()

    def end(self) -> None:
        for process in self.processes:
            process.resume()


class _HungDuring:
    """A trainer's ``say`` that hangs the server from step ``first`` until the loop reaches step
    ``last``: every step between is trained while MLflow answers nothing.

    A watchdog resumes the server after ``patience`` seconds and records that it had to: a loop
    that waited on the server (each call to a hung one runs to the client's 10 s timeout) would
    still be hung then, having made a few dozen steps of hundreds. The bound is a deadlock
    detector, some 30 times what the steps take on this machine, not a speed target.
    """

    def __init__(self, hang: _Hang, first: int, last: int, patience: float = 300.0) -> None:
        self.hang, self.first, self.last = hang, first, last
        self.timer = threading.Timer(patience, self._give_up)
        self.gave_up_at: int | None = None
        self.step = 0
        self.lines: list[str] = []

    def _give_up(self) -> None:
        self.gave_up_at = self.step
        self.hang.end()

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        if not line.startswith("step "):
            return
        self.step = int(line.split()[1].rstrip(":"))
        if self.step == self.first:
            self.hang.start()
            self.timer.start()
        elif self.step == self.last:
            self.timer.cancel()
            self.hang.end()


@pytest.mark.integration
@pytest.mark.faults
def test_training_goes_on_while_the_tracking_server_hangs(
    running_stack: StackConfig, tmp_path: Path
) -> None:
    """Logging every step, with the server hung (SIGSTOP: connections taken, never answered)
    from step 10 to step 400: the loop trains through the outage, and every step's metrics
    arrive once the server answers again. The speed figure is ``flow bench tracking_outage``'s:
    tests make no timed claims."""
    write(tmp_path, "train", [200_000, 200_000])
    uri = running_stack.mlflow.tracking_uri
    steps = 400
    cfg = config(
        tmp_path,
        tracking=True,
        experiment=f"test-outage-{uuid.uuid4().hex[:8]}",
        batch_size=512,
        log_every=1,
        max_steps=steps,
        epochs=100,
        checkpoint_dir=None,
    )
    hang = _Hang(running_stack)
    during = _HungDuring(hang, first=10, last=steps)
    try:
        result = train(cfg, tracking_uri=uri, say=during)
    finally:
        during.timer.cancel()
        hang.end()
    assert during.gave_up_at is None, (
        f"training waited on the hung tracking server: step {during.gave_up_at} of {steps} "
        f"after {during.timer.interval:g} s"
    )
    client = MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(result.run_id or "", "loss")
    assert sorted(m.step for m in history) == list(range(1, steps + 1))
    assert client.get_run(result.run_id or "").data.metrics["steps"] == steps
