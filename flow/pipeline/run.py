"""Running a pipeline file: its command line chooses which stages and for how long, and
:func:`run_main` hands the definition to an engine. Flags choose this, never what the pipeline is
(that is the definition's job).

    if __name__ == "__main__":
        run_main(my_pipeline())

A mistake in the definition or the run (a FlowError) ends the process with one line, ``error:
...``, and exit code 1; ``--debug`` or ``FLOW_DEBUG=1`` adds the traceback. ``my_pipeline()``
runs before ``run_main`` is called, so its errors are reported by the hook that importing
:mod:`flow.pipeline` installs (:func:`flow.console.install_excepthook`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from flow.config import RUN_RESULT_ENV, StackConfig
from flow.console import DEBUG_FLAG, reporting_errors, terminating_as_interrupt
from flow.engine import RunOptions, load_engine
from flow.pipeline.model import Pipeline
from flow.pipeline.outputs import check_run
from flow.pipeline.schema import did_you_mean

__all__ = ["CHECK_FLAG", "RunOptions", "checking_only", "parse_run_args", "run_main"]

CHECK_FLAG = "--check"
"""``python FILE --check``: build the pipeline and parse the arguments, then run nothing."""

_checking = False
"""Set by :func:`checking_only`: ``run_main`` builds and parses, then runs nothing."""


@contextmanager
def checking_only() -> Iterator[None]:
    """Inside, ``run_main`` checks and returns instead of running: ``flow run`` runs a pipeline
    file so before it starts anything (flow.workflows.precheck). A switch of this process, not
    a flag on the command line, so that a file parsing its own arguments first is not told of
    one it does not know. Besides what ``--check`` checks, every location the run writes is
    probed (:func:`flow.pipeline.outputs.check_run`)."""
    global _checking
    _checking = True
    try:
        yield
    finally:
        _checking = False


def parse_run_args(argv: Sequence[str], stage_names: Sequence[str]) -> RunOptions:
    parser = argparse.ArgumentParser(
        prog="flow run PIPELINE.py", description="Run a pipeline's stages."
    )
    parser.add_argument(
        "--stage",
        action="append",
        default=[],
        metavar="{" + ",".join(stage_names) + "}",
        help="stage to run (repeatable; default: all, in order)",
    )
    parser.add_argument(
        "--continuous",
        action="store_true",
        help="keep streams running instead of stopping once caught up",
    )
    parser.add_argument("--duration", type=float, help="with --continuous: stop after SECONDS")
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=10,
        help="live stages: restarts of a failed query from its checkpoint (default: 10)",
    )
    parser.add_argument("--feature-state", help="feature state version (default: latest)")
    parser.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    parser.add_argument(
        "--no-summary",
        action="store_true",
        help="print no table of the stages at the end (a caller that prints its own)",
    )
    parser.add_argument(
        "--since-snapshot", type=int, help="backfill: only event snapshots after this one"
    )
    parser.add_argument(
        DEBUG_FLAG,
        action="store_true",
        help="show the traceback of an error, not only its message (also: FLOW_DEBUG=1)",
    )
    args = parser.parse_args(list(argv))
    for name in args.stage:
        if name not in stage_names:
            # argparse's own choices check, with a suggestion (Python 3.14 has suggest_on_error).
            parser.error(
                f"argument --stage: invalid choice: {name!r} (choose from "
                f"{', '.join(stage_names)}){did_you_mean(name, stage_names)}"
            )
    ordered = tuple(s for s in stage_names if s in args.stage)
    return RunOptions(
        stages=ordered,
        mode="continuous" if args.continuous else "available-now",
        duration_s=args.duration,
        feature_state=args.feature_state,
        tracking=not args.no_tracking,
        since_snapshot=args.since_snapshot,
        max_restarts=args.max_restarts,
        summary=not args.no_summary,
    )


def run_main(spec: Any, engine: str = "spark", argv: Sequence[str] | None = None) -> None:
    """Entry of a pipeline file: ``if __name__ == "__main__": run_main(my_pipeline())``.

    Works under ``spark-submit`` (the session keeps spark-submit's settings) and under ``flow
    run``; ``argv`` (default: the command line) chooses stages and run mode for a
    :class:`~flow.pipeline.Pipeline`. Exits with the engine's exit code; a FlowError exits 1
    with its message on one line (``--debug``: and its traceback). With FLOW_RUN_RESULT set
    (``flow run --json``), the run's outcome goes to that file (:attr:`RunOptions.result_file`).
    """
    args = sys.argv[1:] if argv is None else argv
    # SIGTERM (a scheduler, `flow run` stopping its job) unwinds like Ctrl-C: the stage's
    # query stops and its MLflow runs end as KILLED, not RUNNING forever.
    check = CHECK_FLAG in args or _checking
    args = [a for a in args if a != CHECK_FLAG]
    with reporting_errors(args), terminating_as_interrupt():
        options = RunOptions()
        if isinstance(spec, Pipeline):
            options = parse_run_args(args, [s.name for s in spec.stages])
        if check:  # built and parsed: what can be checked without Spark is checked
            if _checking and isinstance(spec, Pipeline):
                # Under `flow run`, before it starts a driver: every location the run writes.
                check_run(StackConfig.from_env(), spec, options)
            raise SystemExit(0)
        result = os.environ.get(RUN_RESULT_ENV)
        options = replace(options, result_file=Path(result) if result else None)
        code = load_engine(engine).run(spec, StackConfig.from_env(), options)
    raise SystemExit(code)
