"""``flow tune``: a hyperparameter search over the trainer's settings (``trainers.tune``)."""

from __future__ import annotations

import subprocess
import sys

import click

__all__ = ["tune"]


@click.command(
    context_settings={"ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def tune(argv: tuple[str, ...]) -> None:
    """Search the trainer's settings for the best AUC on held-out rows (python -m trainers tune).

    The study's options (--trials, --timeout, --space, --param, --json) and the trainer's, the
    settings each trial starts from; ``flow tune --help`` lists the study's. In its own process,
    like ``flow train``: ``flow`` does not import torch.
    """
    raise SystemExit(subprocess.call([sys.executable, "-m", "trainers", "tune", *argv]))
