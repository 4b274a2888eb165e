"""Training-data insight: what a run trained on, and how it differs from the run before.

    flow insight RUN_ID                      the channels a trainer run read (its lineage tags)
    flow insight --location ctr --channel live

Per feature: counts, missing values, out-of-vocabulary rate, distinct values, quantiles; plots
of the distributions and of the label rate over event time; drift (PSI) against the previous
report of the same channel, which for a run is the report of the run before it (never the run
itself: a second ``flow insight RUN_ID`` compares with what the first did); and, for a run that
read several channels, each channel against the first (live against backfill). Reports go to
``$FLOW_HOME/insight/<location>/<channel>/<time>[-<run id>]/`` and, for a run, into its own
MLflow artifacts under ``insight/<channel>`` (``insight/<channel>-vs-<first>``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.handoff.channel import Channel
from flow.insight.profile import Profile, profile_channel
from flow.insight.report import Insight, write_report

__all__ = ["InsightReport", "channel_insight", "run_channels", "run_insight"]


def _folder(stack: StackConfig, where: str, channel: str) -> Path:
    label = Path(where.rstrip("/")).name or "root"
    digest = hashlib.sha1(where.encode()).hexdigest()[:6]
    return stack.home / "insight" / f"{label}-{digest}" / channel


@dataclass(frozen=True)
class InsightReport:
    """One report: what it is of, what it found, and where its files are."""

    name: str
    """The channel, or ``<channel>-vs-<first channel>`` for a comparison of two."""
    insight: Insight
    folder: Path
    """The local folder of ``report.html``, ``profile.json`` and the plots."""
    artifacts: str = ""
    """Where in the run's MLflow artifacts it went ('' for none)."""


def _previous(folder: Path, run_id: str | None = None) -> Profile | None:
    """The latest report in ``folder`` that is not of ``run_id``, and, when the run has one
    already, older than its first: a report again of the same run keeps its reference."""
    reports = sorted(p.parent for p in folder.glob("*/profile.json"))
    own = [p for p in reports if run_id and p.name.endswith(f"-{run_id}")]
    others = [p for p in reports if p not in own and (not own or p.name < own[0].name)]
    if not others:
        return None
    return Profile.from_dict(json.loads((others[-1] / "profile.json").read_text()))


def channel_insight(
    stack: StackConfig,
    where: str,
    channel: str,
    commits: list[int] | None = None,
    *,
    run_id: str | None = None,
) -> tuple[Insight, Path]:
    """Profile ``commits`` of a channel against the previous report of it (of another run than
    ``run_id``); the report folder."""
    base = _folder(stack, where, channel)
    reference = _previous(base, run_id)
    profile = profile_channel(Channel(where, channel), commits, reference=reference)
    target = _target(base, run_id)
    return write_report(profile, reference, target), target


def _target(base: Path, run_id: str | None) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
    return base / (f"{stamp}-{run_id}" if run_id else stamp)


def _against(
    stack: StackConfig,
    where: str,
    first: tuple[str, list[int] | None],
    other: tuple[str, list[int] | None],
    run_id: str,
) -> tuple[str, Insight, Path]:
    """``other``'s rows profiled in the bins of ``first``'s and compared with them."""
    (name, commits), (other_name, other_commits) = first, other
    reference = profile_channel(Channel(where, name), commits)
    profile = profile_channel(Channel(where, other_name), other_commits, reference=reference)
    label = f"{other_name}-vs-{name}"
    target = _target(_folder(stack, where, label), run_id)
    return label, write_report(profile, reference, target, against=name), target


def _commit_range(text: str) -> list[int] | None:
    if "..." in text or ".." not in text:
        return None
    low, high = text.split("..")
    return list(range(int(low), int(high) + 1))


def run_channels(client: Any, run_id: str) -> tuple[Any, str, dict[str, list[int] | None]]:
    """The trainer run at or under ``run_id``: (run, handoff location, channel -> commits)."""
    run = client.get_run(run_id)
    if "handoff" not in run.data.params:
        children = client.search_runs(
            [run.info.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{run_id}'",
        )
        trainers = [r for r in children if "handoff" in r.data.params]
        if not trainers:
            raise ConfigError(
                f"MLflow run {run_id} is not a trainer run and has none nested under it; give "
                "the id of a run whose trainer read handoff channels, or --location/--channel"
            )
        run = trainers[0]
    channels = run.data.params["channels"].split(",")
    commits = {
        name: _commit_range(run.data.tags.get(f"lineage.{name}.commits", "")) for name in channels
    }
    return run, run.data.params["handoff"], commits


def run_insight(stack: StackConfig, run_id: str) -> list[InsightReport]:
    """Reports for every channel a trainer run read, and for each channel after the first
    against the first (live against backfill), logged into that run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=stack.mlflow.tracking_uri)
    run, where, channels = run_channels(client, run_id)
    trainer = run.info.run_id
    made: list[tuple[str, Insight, Path]] = []
    for name, commits in channels.items():
        insight, folder = channel_insight(stack, where, name, commits, run_id=trainer)
        made.append((name, insight, folder))
    listed = list(channels.items())
    made += [_against(stack, where, listed[0], other, trainer) for other in listed[1:]]
    done = []
    for name, insight, folder in made:
        client.log_artifacts(trainer, str(folder), f"insight/{name}")
        metrics = {f"insight.psi.{name}.{d.feature}": d.psi for d in insight.drift}
        metrics[f"insight.label_rate.{name}"] = insight.profile.label_rate
        for key, value in metrics.items():
            client.log_metric(trainer, key, value)
        done.append(InsightReport(name, insight, folder, f"{trainer}: insight/{name}"))
    return done
