"""``flow check consistency``: Spark's committed features against the Python transform."""

from __future__ import annotations

from pathlib import Path

import click

from flow.cli.common import friendly, stack_config
from flow.cli.jobs import _exit, launch

__all__ = ["check"]

_JOB = Path(__file__).resolve().parents[2] / "spark_jobs" / "consistency.py"


@click.group()
def check() -> None:
    """Checks of what the pipelines wrote."""


@check.command("consistency")
@click.argument("namespace")
@click.argument("channel")
@click.option("--pipeline", help="The pipeline file (default: pipelines/<the writer>.py).")
@click.option("--rows", default=2000, show_default=True, help="Committed rows to check.")
@click.option("--commit", type=int, help="The commit to check (default: the last).")
@click.option("--key", help="A passthrough column naming one row (default: the label join key).")
@friendly
def consistency(
    namespace: str,
    channel: str,
    pipeline: str | None,
    rows: int,
    commit: int | None,
    key: str | None,
) -> None:
    """Featurize committed rows of a backfill CHANNEL again in Python, from their raw inputs,
    and compare with what Spark wrote: integers exactly, floats within 1e-6 relative.

    The raw inputs are the commit's tables at the snapshots it recorded, validated, labelled,
    enriched and derived by the stage's own Spark phases (spark_jobs/consistency.py). Prints
    each feature that differs with examples and exits 1; 0 when every value agrees.
    """
    argv = [str(_JOB), namespace, channel, "--rows", str(rows)]
    for name, value in (("--pipeline", pipeline), ("--commit", commit), ("--key", key)):
        if value is not None:
            argv += [name, str(value)]
    # Tables only (an Iceberg catalog on local files, or Delta): no broker, no MLflow.
    _exit(launch(argv, stack_config(), connectors=frozenset({"delta"})), argv)
