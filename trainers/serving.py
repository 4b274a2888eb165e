"""A served model that takes raw event columns: the feature state applied by flow.transform
(numpy, no JVM), then the trained model.

:class:`RawCTRPredictor` is the pyfunc; :func:`save_features` writes what it needs beside the
model's weights: the feature spec, its fitted state and the Arrow types of the raw columns (a
pandas frame turns an integer column with a null into floats, whose text Spark would hash
otherwise). ``trainers.export.log_model(..., features=...)`` logs it with a signature and an
input example of raw values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from flow.pipeline.features import FeatureSpec, spec_from_dict, spec_to_dict
from flow.pipeline.schema import Field
from flow.pipeline.state import FeatureState
from flow.transform import FeatureTransform
from trainers.export import CTRPredictor

__all__ = ["RawCTRPredictor", "ServingFeatures", "raw_schema", "save_features"]

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
