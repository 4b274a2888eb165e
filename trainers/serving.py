"""A served model that takes raw event columns: the feature state applied by flow.transform
(numpy, no JVM), then the trained model.

:class:`RawCTRPredictor` is the pyfunc; :func:`save_features` writes what it needs beside the
model's weights: the feature spec, its fitted state and the Arrow types of the raw columns (a
pandas frame turns an integer column with a null into floats, whose text Spark would hash
otherwise). ``log_model(..., features=...)`` logs it with a signature and an
input example of raw values.
"""

from __future__ import annotations

import copy
import json
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

import flow
import trainers
from flow.pipeline.features import FeatureSpec, spec_from_dict, spec_to_dict
from flow.pipeline.schema import Field
from flow.pipeline.state import FeatureState, Layout
from flow.transform import FeatureTransform
from trainers.export import CTRPredictor, example_frame, save_model
from trainers.models import CTRModel

__all__ = ["RawCTRPredictor", "ServingFeatures", "log_model", "raw_schema", "save_features"]

_ARROW = {
    "string": pa.string(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "array<string>": pa.list_(pa.string()),
    "array<long>": pa.list_(pa.int64()),
}


@dataclass(frozen=True)
class ServingFeatures:
    """What a raw-input model carries: the spec, its state, the raw columns' fields (from
    ``pipeline.columns[stage]``) and a few raw rows for the input example."""

    spec: FeatureSpec
    state: FeatureState
    fields: dict[str, Field]
    example: pd.DataFrame


def _inputs(features: ServingFeatures) -> dict[str, str]:
    """Each raw column the features read, with its Field type."""
    inputs = FeatureTransform(features.spec, features.state).inputs
    return {c: features.fields[c].type for c in inputs}


def raw_schema(features: ServingFeatures) -> pa.Schema:
    return _schema(_inputs(features))


def _schema(inputs: dict[str, str]) -> pa.Schema:
    return pa.schema([(c, _ARROW[t]) for c, t in inputs.items()])


def save_features(features: ServingFeatures, path: Path) -> Path:
    """The spec, the state and the raw columns' types as one JSON file."""
    plain = {
        "spec": spec_to_dict(features.spec),
        "state": json.loads(features.state.to_json()),
        "inputs": _inputs(features),
    }
    path.write_text(json.dumps(plain, default=list))
    return path


class RawCTRPredictor(CTRPredictor):
    """Click probabilities from raw event columns (after the caller's enrichment)."""

    def load_context(self, context: Any) -> None:
        super().load_context(context)
        saved = json.loads(Path(context.artifacts["features"]).read_text())
        spec = spec_from_dict(saved["spec"])
        state = FeatureState.from_json(json.dumps(saved["state"]))
        self.transform = FeatureTransform(spec, state)
        self.schema = _schema(saved["inputs"])

    def predict(
        self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> np.ndarray:
        """Click probabilities of ``model_input``'s raw rows."""
        missing = [n for n in self.schema.names if n not in model_input.columns]
        if missing:
            raise ValueError(f"input lacks the raw column(s) {', '.join(missing)}")
        table = pa.Table.from_pandas(
            model_input[self.schema.names], schema=self.schema, preserve_index=False
        )
        rows = self.transform.apply(table)
        batch: dict[str, torch.Tensor] = {}
        for column in rows.column_names:
            if column in ("label", "weight"):
                continue
            values = rows.column(column).combine_chunks()
            width = values.type.list_size
            if width == 0:
                continue
            flat = values.flatten().to_numpy(zero_copy_only=False).reshape(len(values), width)
            batch[column] = torch.from_numpy(
                flat.astype(np.int64 if column != "dense" else np.float32)
            )
        with torch.no_grad():
            logits = self.model(batch)
        result: np.ndarray = torch.sigmoid(logits.float()).numpy()
        return result


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

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    example = example_frame(layout) if features is None else features.example
    predictor = CTRPredictor() if features is None else RawCTRPredictor()
    # A copy on the CPU: the training model stays where it is, in training mode.
    predictor.layout, predictor.model = layout, copy.deepcopy(model).cpu().eval()
    cpu_model = predictor.model
    if features is not None:
        predictor.transform = FeatureTransform(features.spec, features.state)
        predictor.schema = raw_schema(features)
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
