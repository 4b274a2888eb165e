"""A served model that takes raw event columns: the feature state applied by flow.transform
(numpy, no JVM), then the trained model.

:class:`RawCTRPredictor` is the pyfunc; :func:`save_features` writes what it needs beside the
model's weights (:class:`flow.transform.serving.ServingFeatures`: the spec, its fitted state,
the raw columns' types and example rows, as the pipeline stage recorded them in its channel).
``log_model(..., features=...)`` logs it with a signature of raw columns and an input example
of raw values.
"""

from __future__ import annotations

import copy
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

import flow
import trainers
from flow.errors import ConfigError
from flow.pipeline.state import Layout
from flow.transform import FeatureTransform
from flow.transform.serving import ServingFeatures
from trainers.export import CTRPredictor, example_frame, one_thread, save_model
from trainers.models import CTRModel

__all__ = [
    "RawCTRPredictor",
    "ServingFeatures",
    "log_model",
    "raw_signature",
    "raw_table",
    "save_features",
]


def save_features(features: ServingFeatures, path: Path) -> Path:
    """The spec, the state, the raw columns' types and the examples as one JSON file."""
    path.write_text(features.to_json())
    return path


def raw_signature(features: ServingFeatures) -> Any:
    """The pyfunc's MLflow signature: one column per raw input, a probability per row out.

    Every column is optional in MLflow's sense, which is what lets a value be null (the
    transform treats a null as the pipeline did); the predictor still wants every column (a
    missing one is more likely a typo than an unknown value). Numbers and times are ``any``:
    MLflow refuses an integer for a ``double`` column and a null in a ``long`` one (pandas makes
    it a float), both of which a raw impression in JSON has; :func:`raw_table` types them and
    names a value that does not fit."""
    from mlflow.models import ModelSignature
    from mlflow.types import DataType
    from mlflow.types.schema import AnyType, Array, ColSpec, Schema, TensorSpec

    kinds: dict[str, Any] = {
        "string": DataType.string,
        "boolean": DataType.boolean,
        "array<string>": Array(DataType.string),
        "array<long>": Array(DataType.long),
    }
    inputs = Schema(
        [
            ColSpec(kinds.get(kind, AnyType()), name, required=False)  # type: ignore[no-untyped-call]
            for name, kind in features.inputs.items()
        ]
    )
    outputs = Schema([TensorSpec(np.dtype(np.float32), (-1,))])
    return ModelSignature(inputs=inputs, outputs=outputs)


def raw_table(frame: pd.DataFrame, schema: pa.Schema) -> pa.Table:
    """``frame``'s raw columns typed as the pipeline read them (a float that is a whole number
    becomes the integer it stands for; ISO text an instant); a missing column or a value of
    another type is a ValueError naming the column."""
    missing = [n for n in schema.names if n not in frame.columns]
    if missing:
        raise ValueError(
            f"input lacks the raw column(s) {', '.join(missing)}; send null for a value that is "
            "not known"
        )
    columns = []
    for field in schema:
        series = frame[field.name]
        try:
            values = pa.array(series, from_pandas=True)
            columns.append(values if values.type == field.type else values.cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as error:
            shown = series.iloc[0] if len(series) else None
            raise ValueError(
                f"raw column {field.name!r} holds {series.dtype} values (e.g. {shown!r}), not "
                f"{field.type}: {error}"
            ) from error
    return pa.Table.from_arrays(columns, schema=schema)


class RawCTRPredictor(CTRPredictor):
    """Click probabilities from raw event columns (after the caller's enrichment)."""

    def load_parts(self, context: Any) -> None:
        super().load_parts(context)
        saved = ServingFeatures.from_json(Path(context.artifacts["features"]).read_text())
        self.prepare(saved)

    def prepare(self, features: ServingFeatures) -> None:
        self.transform = FeatureTransform(features.spec, features.state)
        self.schema = features.schema()

    def predict(
        self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> np.ndarray:
        """Click probabilities of ``model_input``'s raw rows."""
        rows = self.transform.apply(raw_table(model_input, self.schema))
        batch: dict[str, torch.Tensor] = {}
        for column in rows.column_names:
            if column in ("label", "weight"):
                continue
            values = rows.column(column).combine_chunks()
            if not pa.types.is_fixed_size_list(values.type):
                continue  # a block without features (lists of nothing): the model reads none
            width = values.type.list_size
            flat = values.flatten().to_numpy(zero_copy_only=False).reshape(len(values), width)
            batch[column] = torch.from_numpy(
                flat.astype(np.int64 if column != "dense" else np.float32)
            )
        with torch.no_grad(), one_thread():
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

    With ``features`` the pyfunc takes raw event columns (:class:`RawCTRPredictor`): its
    signature and input example are of raw values, and the feature state travels with it.
    Without, it takes the feature columns of ``layout`` (trainers.export.CTRPredictor).
    """
    import mlflow

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    # A copy on the CPU: the training model stays where it is, in training mode.
    cpu_model = copy.deepcopy(model).cpu().eval()
    if features is None:
        predictor: CTRPredictor = CTRPredictor()
        example: pd.DataFrame | None = example_frame(layout)
    else:
        if not features.servable:
            raise ConfigError(
                "the features cannot be applied outside Spark, so a raw-input model would "
                f"score other values than training saw: {'; '.join(features.outside_spark)}"
            )
        predictor = raw = RawCTRPredictor()
        raw.prepare(features)
        if raw.transform.layout != layout:
            raise ConfigError(
                f"the features the channels recorded (spec {features.spec.name!r}, state "
                f"{features.state.version}) make another layout than their rows have "
                f"({raw.transform.layout} against {layout}): the channel was written by "
                "another version of the pipeline; write it again"
            )
        table = features.example_table()
        example = table.to_pandas() if table.num_rows else None
    predictor.layout, predictor.model = layout, cpu_model
    signature = _signature(predictor, example) if features is None else raw_signature(features)
    if example is not None:
        predictor.predict(None, example)  # an example the model cannot score fails here
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


def _signature(predictor: CTRPredictor, example: pd.DataFrame) -> Any:
    """The feature-column pyfunc's signature, inferred from its example."""
    from mlflow.models import infer_signature

    with warnings.catch_warnings():
        # MLflow hints that integer columns cannot hold missing values: indices never miss (0
        # is the null index). Where warnings are errors, that hint would void the signature.
        warnings.filterwarnings("ignore", message=".*Inferred schema contains integer column")
        return infer_signature(example, predictor.predict(None, example))
