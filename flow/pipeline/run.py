"""How to run a pipeline: which stages, and for how long. Flags choose this, never what the
pipeline is (that is the definition's job)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from flow.errors import ConfigError

__all__ = ["RunOptions", "parse_run_args"]

Mode = Literal["available-now", "continuous"]


@dataclass(frozen=True)
class RunOptions:
    """The choices a ``flow run pipelines/x.py ...`` command line makes."""

    stages: tuple[str, ...] = ()
    """Stages to run, in the pipeline's order; empty: all of them."""
    mode: Mode = "available-now"
    """``available-now``: streams process what has arrived and stop. ``continuous``: they keep
    running (until ``duration_s`` passes, if set)."""
    duration_s: float | None = None
    feature_state: str | None = None
    """Feature state version to use; default: the latest fitted for the spec."""
    tracking: bool = True
    """Log to MLflow."""
    since_snapshot: int | None = None
    """Backfill stages read only the Iceberg snapshots of their events after this one."""

    def __post_init__(self) -> None:
        if self.duration_s is not None and self.duration_s <= 0:
            raise ConfigError(f"--duration {self.duration_s} must be positive")
        if self.duration_s is not None and self.mode != "continuous":
            raise ConfigError("--duration applies to --continuous runs")


def parse_run_args(argv: Sequence[str], stage_names: Sequence[str]) -> RunOptions:
    parser = argparse.ArgumentParser(
        prog="flow run PIPELINE.py", description="Run a pipeline's stages."
    )
    parser.add_argument(
        "--stage",
        action="append",
        default=[],
        choices=list(stage_names),
        help="stage to run (repeatable; default: all, in order)",
    )
    parser.add_argument(
        "--continuous",
        action="store_true",
        help="keep streams running instead of stopping once caught up",
    )
    parser.add_argument("--duration", type=float, help="with --continuous: stop after SECONDS")
    parser.add_argument("--feature-state", help="feature state version (default: latest)")
    parser.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    parser.add_argument(
        "--since-snapshot", type=int, help="backfill: only event snapshots after this one"
    )
    args = parser.parse_args(list(argv))
    ordered = tuple(s for s in stage_names if s in args.stage)
    return RunOptions(
        stages=ordered,
        mode="continuous" if args.continuous else "available-now",
        duration_s=args.duration,
        feature_state=args.feature_state,
        tracking=not args.no_tracking,
        since_snapshot=args.since_snapshot,
    )
