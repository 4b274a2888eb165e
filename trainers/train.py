"""A training run: handoff batches -> CTR model -> checkpoints, metrics and MLflow.

    torchrun --nproc-per-node 2 -m trainers train --namespace ctr --channel backfill

One process per rank (torchrun sets RANK and WORLD_SIZE; gloo on CPU, NCCL on GPU). Every
rank reads its own buckets and gets the same number of batches, so DDP's collectives line up.
Checkpoints are taken at step counts (the same on every rank) and hold the model, the optimizer,
the step and each rank's reader cursor: a restarted trainer continues with the next batch.

Measured while training: samples/s, and the data-stall fraction (on CUDA the GPU's idle time
waiting for its next batch, on CPU the loop's wait, over the wall time). Rank 0 tracks a
``train`` and an ``evaluate`` run in MLflow (nested under ``--parent-run-id`` when a pipeline run
started the trainer). Metrics go through a queue that one thread sends (ResilientRun): a
tracking outage costs the training loop nothing; it is reported, and what was logged meanwhile
arrives, with its steps, when the server is back. The rank's own work is
:class:`trainers.session.Session`'s.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch.distributed as dist

from flow.handoff import Channel
from flow.tracking import MlflowTracker, NullTracker, ResilientRun, Tracker
from flow.training import TrainConfig, config_to_dict
from trainers.lifecycle import LauncherGone, Stopped, received
from trainers.lineage import log_lineage
from trainers.promote import Decision, decide, promote, tag_version, version_tags
from trainers.result import (
    TrainResult,
    final_metrics,
    freshness_legs,
    freshness_series,
    headline,
    summary_lines,
)
from trainers.session import Exported, Session, export_model

__all__ = ["TrainResult", "final_metrics", "summary_lines", "train"]

FINAL_FLUSH_S = 300.0
"""How long the end of a run waits for queued tracking calls before exporting the model: about
as long as MLflow's own client retried a call by default (the tracker shortens those retries)."""


def _tracker(config: TrainConfig, tracking_uri: str | None) -> Tracker:
    if not config.tracking or tracking_uri is None:
        return NullTracker()
    return MlflowTracker(tracking_uri, config.experiment)


def train(
    config: TrainConfig,
    *,
    tracking_uri: str | None = None,
    say: Callable[[str], None] = print,
    on_evaluation: Callable[[dict[str, float]], bool] | None = None,
) -> TrainResult:
    """Train on ``config``'s channels; every rank calls this. Rank 0 tracks and exports.

    ``on_evaluation`` sees each evaluation while training (``--early-stop``, ``--eval-every``);
    True stops the run there, pruned: it is evaluated, not exported (``flow tune``).

    Stopped (SIGTERM or SIGINT under :func:`trainers.lifecycle.stopping_on_signals`, or its
    launcher's death), it raises :class:`trainers.lifecycle.Stopped` with the line to say, its
    MLflow runs ended as KILLED."""
    session = None
    try:
        session = Session(config, say, tracking_uri, on_evaluation=on_evaluation)
        return _train(session, config, tracking_uri)
    except KeyboardInterrupt as stop:
        raise _stopped(stop, session) from stop
    except Exception as exc:
        why = received()
        if why is None:
            raise
        # A peer rank stopped by the signal first: this rank's collectives failed with it.
        raise _stopped(KeyboardInterrupt(why.name), session) from exc
    finally:
        if session is not None:
            session.close()


def _stopped(stop: KeyboardInterrupt, session: Session | None) -> Stopped:
    """How a stopped trainer ends: its line (what stopped it, at which step, which checkpoint
    stays) and exit code 128 + the signal."""
    if isinstance(stop, Stopped):
        return stop
    signum = received() or (signal.SIGINT if type(stop) is KeyboardInterrupt else signal.SIGTERM)
    where = f" at step {session.step}" if session is not None else " before its first step"
    if isinstance(stop, LauncherGone):
        said = f"trainer stopped{where}: {stop}"
    elif session is not None and session.launcher.gone():  # its death signal, SIGTERM
        said = f"trainer stopped{where}: its launcher (pid {session.launcher.pid}) is gone"
    else:
        said = f"trainer stopped by {signum.name}{where}"
    checkpoints = session.checkpoints if session is not None else None
    if checkpoints is not None:
        latest = checkpoints.latest()
        kept = (
            f"the checkpoint of step {latest} is kept"
            if latest is not None
            else "no checkpoint was saved"
        )
        said += f"; {kept}"
    return Stopped(said, 128 + signum)


def _train(session: Session, config: TrainConfig, tracking_uri: str | None) -> TrainResult:
    result = TrainResult(leader=session.leader, world_size=session.world.world_size)
    tracker = _tracker(config, tracking_uri if session.leader else None)
    parent = (
        tracker.attach(config.parent_run_id)
        if config.parent_run_id and isinstance(tracker, MlflowTracker)
        else tracker.pipeline_run("trainer", params={"channels": ",".join(config.channels)})
    )
    with parent, tracker.stage("train") as stage, ResilientRun(stage, session.say) as run:
        run.log_params(_params(session.config, session))
        session.run_id = stage.run_id
        result.resumed_from = session.resume()
        session.run(run, result)
        result.run_id = stage.run_id
        run.log_metrics(final_metrics(result), step=result.steps)
        if result.freshness_produced_at:
            run.log_dict(freshness_series(result), "freshness_produced.json")
        if result.picked_up_to_trained_s:
            run.log_dict(freshness_legs(result), "freshness_legs.json")
        for channel, windows in result.by_window.items():
            for start, scores in windows.items():
                run.log_metrics(
                    {f"window_progressive_{k}.{channel}": v for k, v in scores.items()},
                    step=start,
                )
        for line in summary_lines(result):
            session.say(line)
        lineage: dict[str, str] = {}
        if session.leader and session.last_cursor is not None:
            lineage = log_lineage(
                run,
                session.config,
                session.last_cursor,
                layout=session.layout.to_dict(),
                step=session.step,
            )
        if session.leader and config.tracking and tracking_uri and not result.pruned:
            # The model's run shows every metric before the model appears; a server still down
            # after this wait fails the export below.
            run.flush(FINAL_FLUSH_S)
            exported = export_model(session, stage, final=True)
            result.model_uri, result.model_version = exported.uri, exported.version
            result.model_tags = _version_tags(session, exported, lineage)
            if exported.version is not None:
                assert config.register_as is not None
                tag_version(config.register_as, exported.version, result.model_tags, tracking_uri)
        with (
            tracker.stage("evaluate") as stage_run,
            ResilientRun(stage_run, session.say) as evaluation,
        ):
            scores = session.evaluate()
            if scores:
                result.metrics = scores
                evaluation.log_metrics(scores, step=result.steps)
                # The train run's last eval_* are the kept model's (early stopping may keep an
                # earlier one than the last evaluated), so both runs report the same figures.
                run.log_metrics({f"eval_{k}": v for k, v in scores.items()}, step=result.steps)
                session.say(headline(scores, result))
            if config.promote_margin is not None:
                result.decision = _promotion(session, result, scores, [run, evaluation])
    if dist.is_initialized():
        dist.barrier()
    return result


def _promotion(
    session: Session, result: TrainResult, scores: dict[str, float], runs: list[Any]
) -> Decision:
    """Champion or not: every rank evaluates (collectives), rank 0 decides and records."""
    assert session.config.promote_margin is not None
    assert session.config.register_as
    old = session.evaluate(session.champion) if session.champion is not None else None
    decision = decide(scores, old, session.config.promote_margin)
    if not session.leader:
        return decision
    if decision.promote and result.model_version is not None:
        promote(session.config.register_as, result.model_version, session.tracking_uri)
    outcome = "promoted" if decision.promote and result.model_version else "kept"
    tags = {"flow.promotion": outcome, "flow.promotion.reason": decision.reason}
    for run in runs:
        run.set_tags(tags)
    if result.model_version is not None:
        tag_version(session.config.register_as, result.model_version, tags, session.tracking_uri)
    if old is not None:
        runs[-1].log_metrics({f"champion_{k}": v for k, v in old.items()}, step=result.steps)
    session.say(f"{session.config.register_as}: {outcome} ({decision.reason})")
    return decision


def _version_tags(session: Session, exported: Exported, lineage: dict[str, str]) -> dict[str, str]:
    """A registered version's lineage: run, feature state, channels and commits; and, until
    a promotion judges it, that none has (``flow.promotion``)."""
    config = session.config
    made = [Channel(config.location, c) for c in config.channels]
    states = [c.meta().feature_state for c in made if c.exists()]
    tags = version_tags(
        run_id=session.run_id or "",
        channels=config.channels,
        feature_state=next((s for s in states if s), None),
        lineage=lineage,
        inputs=exported.inputs,
    )
    if config.promote_margin is None:
        tags["flow.promotion"] = "not judged"
        tags["flow.promotion.reason"] = (
            "trained without --promote-margin: the champion alias moves only for a judged model"
        )
    return tags


def _params(config: TrainConfig, session: Session) -> dict[str, Any]:
    """Every setting of the run after defaults (issue 48: epochs, early stopping, the eval
    channel and the namespace were missing), and what the session chose for ``auto`` ones."""
    effective = replace(config, optim=config.effective_optim, epochs=config.effective_epochs)
    settings = config_to_dict(effective)
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if key in ("model", "optim"):
            flat |= {f"{key}.{k}": v for k, v in value.items()}
        else:
            flat[key] = ",".join(value) if key == "channels" else value
    return {
        **flat,
        "handoff": config.location,
        "model": config.model.name,
        "early_stop": config.effective_early_stop,
        "world_size": session.world.world_size,
        "device": str(session.device),
        "bf16": session.bf16,
        "shuffle_on": session.shuffle_on,
        "parameters": sum(p.numel() for p in session.model.parameters()),
    }
