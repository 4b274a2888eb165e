"""``flow tune``: trials of tiny trainer runs, pruned from outside, nested in MLflow, the best
registered."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from flow.errors import ConfigError
from flow.training import TrainConfig
from flow.tuning import TuneConfig, build_space
from tests.support import run_flow, stack_env_for
from tests.trainers.channels import write
from tests.trainers.test_train import config
from trainers.__main__ import main
from trainers.train import train
from trainers.tune import tune

# Tiny trials: a few hundred rows, two models to choose from, three epochs at most.
SPACE = ["batch_size=128,256", "model.embedding_dim=4,8", "model.name=dlrm,logistic"]


def channels(root: Path) -> None:
    write(root, "train", [800])
    write(root, "heldout", [400], seed=5)


def trial_base(root: Path, **changes: object) -> TrainConfig:
    return config(root, eval_channel="heldout", epochs=3, checkpoint_dir=None, **changes)


def test_a_watcher_of_the_evaluations_stops_a_run_which_is_then_not_exported(
    tmp_path: Path,
) -> None:
    channels(tmp_path)
    seen: list[dict[str, float]] = []

    def prune_at_second(scores: dict[str, float]) -> bool:
        seen.append(scores)
        return len(seen) == 2

    full = train(trial_base(tmp_path, early_stop=5), say=lambda _: None)
    pruned = train(
        trial_base(tmp_path, early_stop=5), say=lambda _: None, on_evaluation=prune_at_second
    )
    assert not full.pruned
    assert pruned.pruned
    assert len(seen) == 2  # once per epoch, until it said stop
    assert all("auc" in s for s in seen)
    assert pruned.steps == 2 * full.steps // 3  # two of the three epochs
    assert pruned.model_uri is None
    assert "auc" in pruned.metrics  # still evaluated: the pruner's figure has its context


def test_a_study_without_held_out_rows_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    channels(tmp_path)
    argv = ["tune", "--handoff", str(tmp_path), "--channel", "train", "--no-tracking"]
    assert main(argv) == 1
    said = capsys.readouterr().err.strip()
    assert said == (
        "error: flow tune compares trials on held-out rows: give --eval-channel NAME "
        "(or --holdout-share 0.1)"
    )
    assert main([*argv, "--eval-channel", "heldout", "--param", "optim.lrate=0.1:1"]) == 1
    said = capsys.readouterr().err.strip()
    assert said.startswith("error: --param optim.lrate: not a trainer setting flow tune can")
    assert "did you mean 'optim.lr'?" in said


def test_a_study_picks_the_best_of_its_trials_and_says_a_line_for_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    channels(tmp_path)
    argv = ["tune", "--handoff", str(tmp_path), "--channel", "train", "--eval-channel", "heldout"]
    argv += ["--no-tracking", "--device", "cpu", "--epochs", "2", "--trials", "2", "--json"]
    argv += ["--window-batches", "4", "--batch-size", "128", "--embedding-dim", "8"]
    argv += [f"--param={p}" for p in SPACE]
    assert main(argv) == 0
    captured = capsys.readouterr()
    found = json.loads(captured.out)  # stdout holds the result alone
    lines = [line for line in captured.err.splitlines() if line.startswith("trial ")]
    # Trial 1 is the settings given, defaults for the rest (the several-epoch L2, DLRM), then
    # the study's trials.
    defaults = (
        "optim.lr=0.001, optim.embedding_lr=0.05, optim.embedding_weight_decay=0.0001, "
        "model.embedding_dim=8, model.name=dlrm, batch_size=128"
    )
    assert lines[0] == f"trial 1 is the trainer's defaults: {defaults}"
    lines = lines[1:]
    assert [line.split(":")[0] for line in lines] == ["trial 1/2", "trial 2/2"]
    assert lines[0].startswith(f"trial 1/2: {defaults}: eval AUC ")
    assert all("eval AUC" in line and "best" in line for line in lines)
    trials = found["trials"]
    assert [t["trial"] for t in trials] == [1, 2]
    assert found["best"] == max(trials, key=lambda t: t["eval_auc"])
    assert set(found["best"]["params"]) >= {"batch_size", "model.name", "optim.lr"}


@pytest.mark.integration  # MLflow's store and registry (SQLite), three tiny trials
def test_trials_nest_under_the_study_run_and_the_best_is_registered(tmp_path: Path) -> None:
    channels(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    experiment, name = f"tune-{uuid.uuid4().hex[:8]}", f"ctr-{uuid.uuid4().hex[:6]}"
    base = trial_base(tmp_path, tracking=True, experiment=experiment, register_as=name)
    study = TuneConfig(trials=3, space=build_space(None, SPACE))
    result = tune(base, study, tracking_uri=uri, say=lambda _: None)

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    by_id = {r.info.run_id: r for r in runs}
    (parent,) = [r for r in runs if r.info.run_name == "tune"]
    trials = [r for r in runs if r.info.run_name.startswith("trial-")]
    assert sorted(r.info.run_name for r in trials) == ["trial-1", "trial-2", "trial-3"]
    for trial in trials:
        assert trial.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert trial.data.params["model.name"] in ("dlrm", "logistic")
        assert 0.5 < trial.data.metrics["eval_auc"] <= 1.0
        assert "eval_logloss" in trial.data.metrics
        stages = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == trial.info.run_id]
        assert sorted(r.info.run_name for r in stages) == ["evaluate", "train"]
    best = max(trials, key=lambda r: r.data.metrics["eval_auc"])
    assert result.best is not None
    assert result.best.run_id == best.info.run_id
    assert parent.data.metrics["best_eval_auc"] == best.data.metrics["eval_auc"]
    assert parent.data.params["best.model.name"] == best.data.params["model.name"]
    assert parent.data.tags["flow.tune.best_run"] == best.info.run_id

    (version,) = client.search_model_versions(f"name='{name}'")
    assert str(version.version) == result.model_version
    assert version.tags["flow.tune.trial"] == best.data.tags["flow.tune.trial"]
    trained = by_id[version.tags["flow.run_id"]]  # the best trial's own train run
    assert trained.info.run_name == "train"
    assert trained.data.tags["mlflow.parentRunId"] == best.info.run_id


def test_registering_the_best_needs_tracking(tmp_path: Path) -> None:
    channels(tmp_path)
    with pytest.raises(ConfigError, match=r"--register-as needs MLflow tracking"):
        tune(trial_base(tmp_path, register_as="ctr"), TuneConfig(trials=1), tracking_uri=None)


def test_flow_tune_is_the_trainer_s_study_and_its_help_names_the_study_s_options(
    tmp_path: Path,
) -> None:
    done = run_flow(["tune", "--help"], stack_env_for(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: flow tune")
    assert all(o in done.stdout for o in ("--trials", "--timeout", "--space", "--param", "--json"))
