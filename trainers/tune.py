"""A hyperparameter search over the trainer's settings, judged on held-out rows (``flow tune``).

    flow tune --namespace movies --channel ratings --holdout-share 0.1 --epochs 10 --trials 20
    python -m trainers tune --channel backfill --eval-channel holdout --register-as ctr

Each trial is a training run (:func:`trainers.train.train`, in this process) of settings drawn
from the search space (:mod:`flow.tuning`), with early stopping on the evaluation rows up to
``--epochs``; its figure is the evaluation AUC of the model early stopping kept. Trials keep no
checkpoints: each starts afresh, so a study run again trains again. A trial's evaluation AUC
after each epoch (or each ``--eval-every`` steps) goes to Optuna's median pruner, which stops a
trial below the median of the earlier trials at the same evaluation. In MLflow the study is a
``tune`` run, each trial a run nested in it (its settings, its evaluation AUC and log loss) with
the trainer's ``train`` and ``evaluate`` runs nested in that; the study's run records the best
settings and AUC, and ``--register-as NAME`` registers the best trial's model.

Why Optuna: a library, not a runtime. Trials here are sequential runs in one process; Optuna's
define-by-run sampling (TPE), its median pruner and its in-memory study are all they need,
for a few pure-Python dependencies. Ray Tune would bring Ray's cluster runtime (a head process,
workers, an object store) and a much larger install to run the same loop; it pays off for
trials spread over machines, which a study that size does not need.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

from flow.errors import ConfigError
from flow.tracking import MlflowTracker, NullTracker, Run, Tracker
from flow.training import TrainConfig, with_batch_size
from flow.tuning import Range, Scalar, SearchSpace, TuneConfig, apply
from trainers.promote import tag_version
from trainers.train import train

if TYPE_CHECKING:
    import optuna

__all__ = ["Trial", "TuneResult", "check_study", "default_values", "tune"]


@dataclass
class Trial:
    """One trial: its settings and how it ended."""

    number: int
    """From 1."""
    params: dict[str, Scalar]
    state: str = "complete"
    """``complete``, ``pruned`` or ``failed`` (no AUC: the evaluation rows hold one class)."""
    auc: float = math.nan
    logloss: float = math.nan
    evaluations: int = 0
    """Evaluations reported while it trained (what the pruner judged)."""
    run_id: str | None = None
    """Its MLflow run (its ``train`` and ``evaluate`` runs are nested in it)."""
    model_uri: str | None = None
    model_tags: dict[str, str] = field(default_factory=dict)


@dataclass
class TuneResult:
    trials: list[Trial] = field(default_factory=list)
    best: Trial | None = None
    run_id: str | None = None
    """The study's MLflow run."""
    registered_as: str | None = None
    model_version: str | None = None
    """The registered version of the best trial's model (``--register-as``)."""

    def to_dict(self) -> dict[str, Any]:
        """What ``--json`` prints."""

        def trial(t: Trial) -> dict[str, Any]:
            return {
                "trial": t.number,
                "state": t.state,
                "params": t.params,
                "eval_auc": None if math.isnan(t.auc) else t.auc,
                "eval_logloss": None if math.isnan(t.logloss) else t.logloss,
                "run_id": t.run_id,
            }

        return {
            "best": trial(self.best) if self.best else None,
            "trials": [trial(t) for t in self.trials],
            "run_id": self.run_id,
            "registered_as": self.registered_as,
            "model_version": self.model_version,
        }


def check_study(config: TrainConfig, study: TuneConfig, tracking_uri: str | None) -> None:
    """What a study needs from the trainer's settings, before any trial: one line if not."""
    if not config.eval_channel and not config.holdout_share:
        raise ConfigError(
            "flow tune compares trials on held-out rows: give --eval-channel NAME "
            "(or --holdout-share 0.1)"
        )
    if config.follow:
        raise ConfigError("flow tune trains on closed channels; leave --follow out")
    if config.promote_margin is not None or config.init_from_champion:
        raise ConfigError(
            "flow tune registers its best trial without judging it against the champion; leave "
            "--promote-margin and --init-from-champion out (judge it with flow retrain)"
        )
    if config.register_as and not (config.tracking and tracking_uri):
        raise ConfigError("--register-as needs MLflow tracking; leave --no-tracking out")
    study.space.check(_trial_base(config, study))


def _trial_base(config: TrainConfig, study: TuneConfig) -> TrainConfig:
    """The settings every trial starts from: the study registers, trials keep no checkpoints
    (each starts afresh), and early stopping chooses how long each trains."""
    return replace(
        config,
        register_as=None,
        checkpoint_dir=None,
        early_stop=config.early_stop or study.patience,
    )


class _Pruning:
    """Reports a trial's evaluation AUCs to Optuna; True when its pruner stops the trial."""

    def __init__(self, trial: optuna.Trial) -> None:
        self.trial = trial
        self.evaluations = 0

    def __call__(self, scores: dict[str, float]) -> bool:
        auc = scores.get("auc", math.nan)
        if math.isnan(auc):
            return False
        # By evaluation count, not training step: trials of other batch sizes take other
        # numbers of steps to the same epoch.
        self.trial.report(auc, self.evaluations)
        self.evaluations += 1
        return self.trial.should_prune()


def _sample(trial: optuna.Trial, space: SearchSpace) -> dict[str, Scalar]:
    values: dict[str, Scalar] = {}
    for param in space.params:
        if isinstance(param, Range) and param.integer:
            values[param.name] = trial.suggest_int(
                param.name, int(param.low), int(param.high), log=param.log
            )
        elif isinstance(param, Range):
            values[param.name] = trial.suggest_float(
                param.name, param.low, param.high, log=param.log
            )
        else:
            # One of param.values, which hold no None: Optuna's type allows for it.
            values[param.name] = cast(Scalar, trial.suggest_categorical(param.name, param.values))
    return values


def default_values(base: TrainConfig, space: SearchSpace) -> dict[str, Scalar]:
    """The settings ``base`` trains with, defaults applied (the derived batch size, the
    several-epoch L2), for each of ``space``'s settings whose range or choices hold them."""
    effective = replace(base, optim=base.effective_optim)
    if effective.batch_size is None:
        effective, _ = with_batch_size(effective)
    found: dict[str, Scalar] = {}
    for param in space.params:
        group, _, name = param.name.rpartition(".")
        holder: Any = getattr(effective, group) if group else effective
        value = getattr(holder, name, None)
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            continue
        if isinstance(param, Range):
            if isinstance(value, str) or not param.low <= value <= param.high:
                continue
        elif value not in param.values:
            continue
        found[param.name] = value
    return found


def _shown(values: Mapping[str, Scalar]) -> str:
    return ", ".join(
        f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()
    )


def tune(
    config: TrainConfig,
    study: TuneConfig,
    *,
    tracking_uri: str | None,
    say: Callable[[str], None] = print,
) -> TuneResult:
    """Run the study: ``study.trials`` trials of ``config`` with settings drawn from
    ``study.space``; ``say`` gets a line per trial. ``config.seed`` seeds the sampler and every
    trial's training."""
    import optuna

    check_study(config, study, tracking_uri)
    base = _trial_base(config, study)
    if base.effective_epochs == 1 and not base.eval_every:
        say(
            "each trial trains one epoch: give --epochs 10 for early stopping and pruning to choose"
        )
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our line per trial instead of its
    tracked = bool(config.tracking and tracking_uri)
    tracker: Tracker = (
        MlflowTracker(tracking_uri, config.experiment)
        if tracked and tracking_uri
        else NullTracker()
    )
    result = TuneResult(registered_as=config.register_as)
    sampler = optuna.samplers.TPESampler(seed=config.seed)
    # The first evaluation of a slow learning rate says little: judged from the second on.
    pruner = optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1)
    optimizer = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
    params = {
        "channels": ",".join(config.channels),
        "eval_channel": config.eval_channel,
        "holdout_share": config.holdout_share,
        "trials": study.trials,
        "timeout_s": study.timeout_s,
        "seed": config.seed,
        "epochs": base.effective_epochs,
        "early_stop": base.early_stop,
        **{f"space.{k}": v for k, v in study.space.to_dict().items()},
    }

    # Trial 1 is the trainer's defaults (as far as the space holds them): a study's best is
    # then never below what a run without settings gets on the same held-out rows.
    defaults = default_values(base, study.space)
    if defaults:
        optimizer.enqueue_trial(dict(defaults))
        say(f"trial 1 is the trainer's defaults: {_shown(defaults)}")

    def objective(trial: optuna.Trial) -> float:
        done = _trial(trial, base, study, tracker, tracking_uri if tracked else None)
        result.trials.append(done)
        if done.state == "complete" and (result.best is None or done.auc > result.best.auc):
            result.best = done
        say(_progress(done, study.trials, result.best))
        if done.state == "pruned":
            raise optuna.TrialPruned()
        return done.auc  # NaN: Optuna records the trial as failed

    with tracker.pipeline_run("tune", params=params, tags={"flow.tune": "study"}) as parent:
        result.run_id = parent.run_id if tracked else None
        optimizer.optimize(objective, n_trials=study.trials, timeout=study.timeout_s)
        _record(parent, result)
        if result.best is None:
            raise ConfigError(
                "no trial gave an evaluation AUC: the held-out rows hold one class only; give "
                "an --eval-channel with clicks and non-clicks"
            )
        if config.register_as and result.best.model_uri:
            result.model_version = _register(config.register_as, result, tracking_uri)
    return result


def _trial(
    trial: optuna.Trial,
    base: TrainConfig,
    study: TuneConfig,
    tracker: Tracker,
    tracking_uri: str | None,
) -> Trial:
    """One trial trained and evaluated, in its own MLflow run."""
    values = _sample(trial, study.space)
    done = Trial(trial.number + 1, values)
    settings = apply(base, values)
    pruning = _Pruning(trial)
    with tracker.stage(f"trial-{done.number}") as run:
        run.log_params(values)
        run.set_tags({"flow.tune.trial": str(done.number)})
        if tracking_uri is not None:
            done.run_id = run.run_id
            settings = replace(settings, parent_run_id=run.run_id)
        trained = train(settings, tracking_uri=tracking_uri, say=_quiet, on_evaluation=pruning)
        done.auc = trained.metrics.get("auc", math.nan)
        done.logloss = trained.metrics.get("logloss", math.nan)
        done.evaluations = pruning.evaluations
        done.model_uri, done.model_tags = trained.model_uri, trained.model_tags
        done.state = (
            "pruned" if trained.pruned else "failed" if math.isnan(done.auc) else "complete"
        )
        run.log_metrics({"eval_auc": done.auc, "eval_logloss": done.logloss})
        run.set_tags({"flow.tune.state": done.state})
    return done


def _quiet(_: str) -> None:
    """A trial's trainer lines: the study says one line per trial instead."""


def _progress(done: Trial, total: int, best: Trial | None) -> str:
    outcome = {
        "complete": f"eval AUC {done.auc:.4f}",
        "pruned": f"pruned after {done.evaluations} evaluation(s), eval AUC {done.auc:.4f}",
        "failed": "no eval AUC (one class in the held-out rows)",
    }[done.state]
    so_far = f"best {best.auc:.4f} (trial {best.number})" if best else "no best yet"
    return f"trial {done.number}/{total}: {_shown(done.params)}: {outcome}; {so_far}"


def _record(parent: Run, result: TuneResult) -> None:
    """The study's run: the best settings and figures, and how the trials ended."""
    states = [t.state for t in result.trials]
    parent.log_metrics(
        {f"trials_{s}": float(states.count(s)) for s in ("complete", "pruned", "failed")}
    )
    best = result.best
    if best is None:
        return
    parent.log_params({f"best.{k}": v for k, v in best.params.items()})
    parent.log_metrics({"best_eval_auc": best.auc, "best_eval_logloss": best.logloss})
    parent.set_tags(
        {"flow.tune.best_trial": str(best.number), "flow.tune.best_run": str(best.run_id)}
    )


def _register(name: str, result: TuneResult, tracking_uri: str | None) -> str:
    """Register the best trial's model under ``name``, tagged as the trainer tags its own."""
    import mlflow

    best = result.best
    assert best is not None
    assert best.model_uri is not None
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    version = str(mlflow.register_model(best.model_uri, name).version)
    tags = {
        **best.model_tags,
        "flow.tune.run_id": str(result.run_id),
        "flow.tune.trial": str(best.number),
    }
    tag_version(name, version, tags, tracking_uri)
    return version


def parse_tune_args(argv: list[str]) -> tuple[TuneConfig, bool, list[str]]:
    """The study's own options (``--trials``, ``--timeout``, ``--space``, ``--param``,
    ``--json``), and the rest: the trainer's settings every trial starts from."""
    import argparse
    from pathlib import Path

    from flow.tuning import build_space

    parser = argparse.ArgumentParser(
        prog="flow tune",
        allow_abbrev=False,  # a prefix of a trainer's flag must reach the trainer's parser
        description="Search the trainer's settings for the best AUC on held-out rows (Optuna).",
        epilog="Every other option is the trainer's (python -m trainers train --help): the "
        "settings each trial starts from. --seed seeds the search and every trial; "
        "--register-as NAME registers the best trial's model. See docs/trainers.md, Tuning.",
    )
    parser.add_argument("--trials", type=int, default=TuneConfig.trials, help="trials at most")
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds after which no trial starts"
    )
    parser.add_argument(
        "--space", type=Path, default=None, help="a JSON search space instead of the default"
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=SPEC",
        help="one setting's range or choices, over the space: optim.lr=1e-4:1e-2:log, "
        "model.embedding_dim=8,16,32, model.name=dlrm (fixed)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    own, rest = parser.parse_known_args(argv)
    space = build_space(own.space, own.param)
    return TuneConfig(trials=own.trials, timeout_s=own.timeout, space=space), own.json, rest
