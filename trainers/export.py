"""The trained model in MLflow: a pyfunc with a signature, registered when asked.

The pyfunc takes one row per prediction with a column per feature, named as in the feature
layout: dense features as floats, categorical features as their indices (int64), sequence
features (``seq_<name>``) as lists of indices, ``Id`` features as their raw int64 ids (the model
carries its dynamic tables' mappings, in eval mode: it looks ids up, never admits). It returns
the click probability. Serving code therefore applies the same feature state as the pipeline did
(the layout names it).
"""

from __future__ import annotations

import copy
import tempfile
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

import flow
import trainers
from flow.pipeline.state import Layout
from flow.training import ModelConfig
from trainers.models import CTRModel, build_model

if TYPE_CHECKING:
    from trainers.serving import ServingFeatures

__all__ = ["CTRPredictor", "batch_from_frame", "example_frame", "log_model", "save_model"]


def example_frame(layout: Layout, rows: int = 2) -> pd.DataFrame:
    """A frame of the pyfunc's input: zeros for numbers, index 1 for categories."""
    data: dict[str, Any] = {name: np.zeros(rows, dtype=np.float32) for name in layout.dense}
    data |= {name: np.ones(rows, dtype=np.int64) for name, _ in layout.sparse}
    data |= {name: np.ones(rows, dtype=np.int64) for name in layout.ids}
    for name, _, length in layout.sequences:
        data[f"seq_{name}"] = [np.ones(length, dtype=np.int64) for _ in range(rows)]
    return pd.DataFrame(data)


def batch_from_frame(frame: pd.DataFrame, layout: Layout) -> dict[str, torch.Tensor]:
    """The model's batch from the pyfunc's input; a missing column is named."""
    wanted = [*layout.dense, *(n for n, _ in layout.sparse), *layout.ids]
    wanted += [f"seq_{n}" for n, _, _ in layout.sequences]
    missing = [c for c in wanted if c not in frame.columns]
    if missing:
        raise ValueError(f"input lacks the feature column(s) {', '.join(missing)}")
    batch: dict[str, torch.Tensor] = {}
    if layout.dense:
        dense = frame[list(layout.dense)].to_numpy(dtype=np.float32)
        batch["dense"] = torch.from_numpy(np.ascontiguousarray(dense))
    if layout.sparse:
        sparse = frame[[n for n, _ in layout.sparse]].to_numpy(dtype=np.int64)
        batch["sparse"] = torch.from_numpy(np.ascontiguousarray(sparse))
    if layout.ids:
        ids = frame[list(layout.ids)].to_numpy(dtype=np.int64)
        batch["ids"] = torch.from_numpy(np.ascontiguousarray(ids))
    for name, _, length in layout.sequences:
        values = np.stack([np.asarray(v, dtype=np.int64)[:length] for v in frame[f"seq_{name}"]])
        batch[f"seq_{name}"] = torch.from_numpy(values)
    return batch


def _mlflow_pyfunc() -> Any:
    import mlflow.pyfunc

    return mlflow.pyfunc


class CTRPredictor(_mlflow_pyfunc().PythonModel):  # type: ignore[misc]
    """Click probabilities from a frame of feature values."""

    def load_context(self, context: Any) -> None:
        saved = torch.load(context.artifacts["model"], map_location="cpu", weights_only=False)
        self.layout = Layout.from_dict(saved["layout"])
        self.model = build_model(ModelConfig(**saved["model_config"]), self.layout)
        self.model.load_state_dict(saved["state"])
        self.model.eval()

    # A DataFrame hint gives MLflow no schema of its own: the signature log_model() passes holds.
    def predict(
        self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> np.ndarray:
        """Click probabilities of ``model_input``'s rows."""
        with torch.no_grad():
            logits = self.model(batch_from_frame(model_input, self.layout))
        result: np.ndarray = torch.sigmoid(logits.float()).numpy()
        return result


def save_model(model: CTRModel, layout: Layout, path: Path) -> Path:
    """The model's artifact: its weights (and a baseline's counts), config and layout, which
    :class:`CTRPredictor` (and the champion's warm start) build the same model from."""
    torch.save(
        {
            "state": model.state_dict(),
            "model_config": asdict(model.config),
            "layout": layout.to_dict(),
        },
        path,
    )
    return path


def log_model(
    model: CTRModel,
    layout: Layout,
    run_id: str,
    *,
    tracking_uri: str | None,
    register_as: str | None,
    features: ServingFeatures | None = None,
) -> tuple[str, str | None]:
    """Log ``model`` to ``run_id`` as a pyfunc with a signature; its URI and registry version.

    With ``features`` the pyfunc takes raw event columns (trainers.serving.RawCTRPredictor):
    its signature and input example are of raw values, and the feature state travels with it.
    """
    import mlflow
    from mlflow.models import infer_signature

    from trainers.serving import RawCTRPredictor, save_features

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    example = example_frame(layout) if features is None else features.example
    predictor = CTRPredictor() if features is None else RawCTRPredictor()
    # A copy on the CPU: the training model stays where it is, in training mode.
    predictor.layout, predictor.model = layout, copy.deepcopy(model).cpu().eval()
    cpu_model = predictor.model
    if features is not None:
        from flow.transform import FeatureTransform

        predictor.transform = FeatureTransform(features.spec, features.state)
        predictor.schema = _raw_schema(features)
    with warnings.catch_warnings():
        # MLflow hints that integer columns cannot hold missing values: indices never miss (0
        # is the null index). Where warnings are errors, that hint would void the signature.
        warnings.filterwarnings("ignore", message=".*Inferred schema contains integer column")
        signature = infer_signature(example, predictor.predict(None, example))
    with tempfile.TemporaryDirectory() as folder:
        path = save_model(cpu_model, layout, Path(folder) / "model.pt")
        artifacts = {"model": str(path)}
        if features is not None:
            artifacts["features"] = str(save_features(features, Path(folder) / "features.json"))
        with mlflow.start_run(run_id=run_id):
            info = mlflow.pyfunc.log_model(
                name="model",
                # Loads the model (and the feature state) from the artifacts.
                python_model=CTRPredictor() if features is None else RawCTRPredictor(),
                artifacts=artifacts,
                signature=signature,
                input_example=example,
                registered_model_name=register_as,
                # The model's code travels with it: no install of this project is needed.
                code_paths=[str(Path(p).parent) for p in (flow.__file__, trainers.__file__)],
                pip_requirements=["torch", "pandas", "numpy", "pyarrow", "xxhash"],
            )
            # Leave the run open: its tracker (or a continuous trainer) ends it.
            mlflow.end_run(status="RUNNING")
    version = getattr(info, "registered_model_version", None)
    return str(info.model_uri), str(version) if version is not None else None


def _raw_schema(features: ServingFeatures) -> Any:
    from trainers.serving import raw_schema

    return raw_schema(features)
