"""The champion model: warm starts from it, and promotion only when a new model is not worse.

The registry alias ``champion`` marks the model version serving traffic. A new version is
evaluated against the champion on the same held-out rows; it takes the alias only if its AUC is
not below the champion's by more than ``margin``. Otherwise the champion stays, and the reason
is recorded on the run and on the version (``flow.promotion``, ``flow.promotion.reason``),
beside what the version was trained on (:func:`version_tags`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from flow.errors import ConfigError
from flow.pipeline.state import Layout
from flow.training import ModelConfig
from trainers.models import CTRModel, build_model

__all__ = [
    "ALIAS",
    "Decision",
    "champion_state",
    "decide",
    "load_champion",
    "promote",
    "tag_version",
    "version_tags",
]

ALIAS = "champion"


def champion_state(name: str, tracking_uri: str | None) -> dict[str, Any] | None:
    """The saved weights, config and layout of ``name``'s champion; None when it has none."""
    import mlflow
    from mlflow.exceptions import MlflowException

    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    try:
        version = client.get_model_version_by_alias(name, ALIAS)
    except MlflowException:
        return None  # no such model, or no champion yet
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    folder = Path(mlflow.artifacts.download_artifacts(f"models:/{name}@{ALIAS}"))
    saved: dict[str, Any] = torch.load(
        folder / "artifacts" / "model.pt", map_location="cpu", weights_only=False
    )
    saved["version"] = version.version
    return saved


def load_champion(saved: dict[str, Any], layout: Layout) -> CTRModel:
    """The champion as a model for ``layout``; a model of another layout cannot warm-start."""
    if Layout.from_dict(saved["layout"]) != layout:
        raise ConfigError(
            f"the champion (version {saved.get('version')}) was trained on another feature layout "
            "(a refitted feature state or another spec); retrain with the champion's feature "
            "state, or train from scratch without --init-from-champion"
        )
    model = build_model(ModelConfig(**saved["model_config"]), layout)
    model.load_state_dict(saved["state"])
    return model


@dataclass(frozen=True)
class Decision:
    promote: bool
    reason: str
    new_auc: float
    champion_auc: float | None


def decide(
    new_scores: dict[str, float],
    champion_scores: dict[str, float] | None,
    margin: float,
) -> Decision:
    new = float(new_scores.get("auc", float("nan")))
    if new != new:  # NaN: nothing to judge on
        return Decision(False, "the held-out rows give no AUC (one class only)", new, None)
    if champion_scores is None:
        return Decision(True, "no champion yet", new, None)
    old = float(champion_scores["auc"])
    if new >= old - margin:
        return Decision(True, f"AUC {new:.4f} vs champion {old:.4f} (margin {margin})", new, old)
    return Decision(
        False, f"AUC {new:.4f} is below the champion's {old:.4f} by more than {margin}", new, old
    )


def promote(name: str, version: str, tracking_uri: str | None) -> None:
    import mlflow

    mlflow.MlflowClient(tracking_uri=tracking_uri).set_registered_model_alias(name, ALIAS, version)


def version_tags(
    *,
    run_id: str,
    channels: tuple[str, ...],
    feature_state: str | None,
    lineage: Mapping[str, str],
    inputs: str,
) -> dict[str, str]:
    """What a model version was trained on: the training run, the feature state, the channels
    and the commits read of each (``lineage.<channel>.commits`` of trainers.lineage, first..last),
    and whether it takes ``raw`` event columns or ``features``."""
    tags = {
        "flow.run_id": run_id,
        "flow.feature_state": feature_state or "unknown",
        "flow.channels": ",".join(channels),
        "flow.inputs": inputs,
    }
    for channel in channels:
        tags[f"flow.commits.{channel}"] = lineage.get(f"lineage.{channel}.commits", "none")
    return tags


def tag_version(name: str, version: str, tags: Mapping[str, str], tracking_uri: str | None) -> None:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
