"""``python -m trainers COMMAND``: the trainers' entry point.

    torchrun --nproc-per-node 2 -m trainers train --namespace ctr --channel backfill --epochs 2
    python -m trainers train --channel live --follow --export-every 1000 --register-as ctr
    python -m trainers train --config run.json [--flags that override it]
    python -m trainers tune --channel backfill --eval-channel holdout --trials 20 [--json]
    python -m trainers doctor [--require-gpu] [--json]

``train --help`` lists every setting of ``flow.training.TrainConfig``, from which the command
line is generated (model, optimizer, mixing, checkpoints, tracking); ``tune`` (``flow tune``)
searches them (``trainers.tune``). A mistake (an unknown
``FLOW_*`` variable, a bad ``--config`` file, a missing channel) ends with one line, ``error:
...``, and exit code 1; ``--debug`` (or ``FLOW_DEBUG=1``) adds its traceback.
"""

from __future__ import annotations

import json
import sys
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from flow.console import DEBUG_FLAG, debug_requested, report_error
from flow.errors import FlowError

if TYPE_CHECKING:  # torch loads only when a command runs
    from trainers.result import TrainResult

COMMANDS = ("train", "tune", "doctor")


def _train(argv: list[str]) -> int:
    from flow.config import StackConfig
    from flow.training import parse_args
    from trainers.result import LEGS, freshness_legs, freshness_series
    from trainers.train import train

    stack = StackConfig.from_env()
    config = parse_args(argv).resolved(stack)
    result = train(config, tracking_uri=stack.mlflow.tracking_uri)
    summary = {
        **asdict(result),
        "samples_per_s": result.samples_per_s,
        "data_stall_fraction": result.stall_fraction,
        "freshness_s": {
            name: {"p50": result.freshness(0.5, name), "p99": result.freshness(0.99, name)}
            for name in result.freshness_s
        },
        "freshness_produced_s": {
            name: {
                "p50": result.freshness(0.5, name, since="produced"),
                "p99": result.freshness(0.99, name, since="produced"),
            }
            for name in result.freshness_produced_s
        },
    }
    del summary["freshness_produced_at"]
    for name in LEGS:  # per batch or commit: their quantiles here, in full in the file
        summary[f"{name}_s"] = {
            channel: {"p50": result.leg(name, 0.5, channel), "p99": result.leg(name, 0.99, channel)}
            for channel in result.picked_up_to_trained_s
        }
    if config.result_file is not None and result.leader:
        # The batches' freshness in order: for the file, not the terminal.
        written = {
            **summary,
            "freshness_produced_series": freshness_series(result),
            "freshness_legs": freshness_legs(result),
        }
        config.result_file.write_text(json.dumps(written, indent=2, default=str))
    if result.leader:
        print(headline(result, config.result_file), flush=True)
        if config.result_file is None:  # the whole result, for scripts, where no file holds it
            print("trainer: " + json.dumps(summary, default=str))
    return 0


def _tune(argv: list[str]) -> int:
    from flow.config import StackConfig
    from flow.training import parse_args
    from trainers.tune import parse_tune_args, tune

    study, as_json, rest = parse_tune_args(argv)
    stack = StackConfig.from_env()
    config = parse_args(rest, prog="flow tune").resolved(stack)

    def say(line: str) -> None:  # with --json, stdout holds the result alone
        print(line, file=sys.stderr if as_json else sys.stdout, flush=True)

    result = tune(config, study, tracking_uri=stack.mlflow.tracking_uri, say=say)
    best = result.best
    assert best is not None  # tune() raises when no trial gave a figure
    if as_json:
        print(json.dumps(result.to_dict(), indent=2, default=str), flush=True)
        return 0
    said = f"tune: best trial {best.number}, eval AUC {best.auc:.4f}: " + ", ".join(
        f"{k}={v}" for k, v in best.params.items()
    )
    if result.run_id:
        said += f"; MLflow run {result.run_id}"
    if result.model_version:
        said += f" ({result.registered_as} version {result.model_version})"
    print(said, flush=True)
    return 0


def headline(result: TrainResult, result_file: Path | None) -> str:
    """The run in one line a person reads: how much, how fast, how good, where the rest is."""
    figures = [f"{result.steps:,} steps", f"{result.rows:,} rows"]
    if result.seconds:
        figures.append(f"{result.samples_per_s:,.0f} samples/s")
    if "auc" in result.metrics:  # the evaluation of the model the run keeps (issue 48)
        kept = result.best_step if result.best_step is not None else result.steps
        figures.append(f"eval AUC {result.metrics['auc']:.4f} (the model of step {kept:,})")
    else:
        for name in ("eval_auc", "run_progressive_auc"):
            if name in result.metrics:
                figures.append(f"{name.replace('run_', '')} {result.metrics[name]:.4f}")
                break
    said = "trainer: done, " + ", ".join(figures)
    if result.run_id:
        said += f"; MLflow run {result.run_id}"
    if result.model_version:
        said += f" (model version {result.model_version})"
    if result_file is not None:
        said += f"; the whole result in {result_file}"
    return said


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(
            f"usage: python -m trainers {{{','.join(COMMANDS)}}} [{DEBUG_FLAG}] ...",
            file=sys.stderr,
        )
        return 2
    command, args = argv[0], [a for a in argv[1:] if a != DEBUG_FLAG]
    try:
        if command == "train":
            return _stoppable(args, debug=debug_requested(argv))
        if command == "tune":
            return _tune(args)
        from trainers.doctor import main as doctor

        return doctor(args)
    except FlowError as exc:
        if _said_here(exc):
            report_error(exc, debug=debug_requested(argv))
        _leave_process_group()
        return 1


def _leave_process_group() -> None:
    """Leave the ranks' process group before exiting on a mistake: left to the interpreter's
    end, gloo's threads may abort the process (SIGABRT, "terminate called without an active
    exception") in place of its exit code 1. Torch is only asked if a command loaded it."""
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _said_here(error: FlowError) -> bool:
    """Whether this rank says ``error``: one that every rank raises alike, rank 0 alone."""
    from flow.handoff import World
    from trainers.lifecycle import FolderInUseError

    return not isinstance(error, FolderInUseError) or World.from_env().rank == 0


def _stoppable(args: list[str], *, debug: bool) -> int:
    """``train``, which SIGTERM or SIGINT stops in one line (rank 0's) and 128 + the signal."""
    from flow.handoff import World
    from trainers.lifecycle import Stopped, stopping_on_signals

    try:
        with stopping_on_signals():
            return _train(args)
    except Stopped as stop:
        if debug:
            traceback.print_exception(stop)
        if World.from_env().rank == 0:
            print(stop.line, file=sys.stderr, flush=True)
        return stop.code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
