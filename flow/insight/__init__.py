"""Training-data insight: what a run trained on, and how it differs from the run before.

    flow insight RUN_ID                      the channels a trainer run read (its lineage tags)
    flow insight --location ctr --channel live

Per feature: counts, missing values, out-of-vocabulary rate, distinct values, quantiles; plots
of the distributions and of the label rate over event time; drift (PSI) against the previous
report of the same channel. Reports go to ``$FLOW_HOME/insight/<location>/<channel>/<time>/``
and, for a run, into its MLflow artifacts under ``insight/<channel>``.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.handoff.channel import Channel
from flow.insight.profile import Profile, profile_channel
from flow.insight.report import Insight, write_report

__all__ = ["channel_insight", "run_channels", "run_insight"]


def _folder(stack: StackConfig, where: str, channel: str) -> Path:
    label = Path(where.rstrip("/")).name or "root"
    digest = hashlib.sha1(where.encode()).hexdigest()[:6]
    return stack.home / "insight" / f"{label}-{digest}" / channel


def _previous(folder: Path) -> Profile | None:
    earlier = sorted(p for p in folder.glob("*/profile.json"))
    return Profile.from_dict(json.loads(earlier[-1].read_text())) if earlier else None


def channel_insight(
    stack: StackConfig, where: str, channel: str, commits: list[int] | None = None
) -> tuple[Insight, Path]:
    """Profile ``commits`` of a channel against the previous report of it; the report folder."""
    base = _folder(stack, where, channel)
    reference = _previous(base)
    profile = profile_channel(Channel(where, channel), commits, reference=reference)
    target = base / datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
    return write_report(profile, reference, target), target


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


def run_insight(stack: StackConfig, run_id: str) -> list[tuple[str, Insight]]:
    """Reports for every channel a trainer run read, logged into that run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=stack.mlflow.tracking_uri)
    run, where, channels = run_channels(client, run_id)
    done = []
    for name, commits in channels.items():
        insight, folder = channel_insight(stack, where, name, commits)
        client.log_artifacts(run.info.run_id, str(folder), f"insight/{name}")
        metrics = {f"insight.psi.{name}.{d.feature}": d.psi for d in insight.drift}
        metrics[f"insight.label_rate.{name}"] = insight.profile.label_rate
        for key, value in metrics.items():
            client.log_metric(run.info.run_id, key, value)
        done.append((name, insight))
    return done
