"""The raw-input pyfunc: raw event columns in, the same probabilities as the model on the
features the Python transform computes from them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

from flow.pipeline.state import FeatureState, layout
from flow.training import ModelConfig
from flow.transform import FeatureTransform
from pipelines.ctr import ctr_features
from pipelines.ctr_backfill import ctr_backfill
from trainers.export import save_model
from trainers.models import build_model
from trainers.serving import RawCTRPredictor, ServingFeatures, raw_schema, save_features

SPEC = ctr_features()
STATE = FeatureState(
    SPEC.name,
    SPEC.fingerprint,
    vocabularies={
        "user_country": ["us", "de"],
        "user_favorite_category": ["books", "games"],
        "item_category": ["books", "games", "toys"],
        "item_brand": ["acme"],
        "device": ["ios", "android", "web"],
    },
    moments=dict.fromkeys(("user_age", "item_price", "item_rating", "position"), (1.0, 2.0)),
    boundaries={"price_bucket": [1.0, 2.0, 3.5]},
)
RAW = pd.DataFrame(
    {
        "user_id": [7, 8, None],
        "item_id": [3, 4, 5],
        "position": [1, 12, None],
        "device": ["ios", None, "web"],
        "user_country": ["us", "fr", None],
        "user_age": [30, None, 95],
        "user_favorite_category": ["books", None, "games"],
        "user_recent_items": [[1, 2, None], None, []],
        "item_category": ["toys", "books", None],
        "item_brand": ["acme", "other", None],
        "item_price": [9.5, None, 120.0],
        "item_rating": [4.5, 3.0, None],
    }
)


def test_the_raw_pyfunc_scores_raw_rows_as_the_model_scores_their_features(
    tmp_path: Path,
) -> None:
    fields = ctr_backfill().columns["backfill"]
    features = ServingFeatures(SPEC, STATE, fields, RAW.head(2))
    rows = layout(SPEC, STATE)
    model = build_model(ModelConfig("logistic"), rows)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    artifacts = {
        "model": str(save_model(model, rows, tmp_path / "model.pt")),
        "features": str(save_features(features, tmp_path / "features.json")),
    }
    assert set(json.loads(Path(artifacts["features"]).read_text())["inputs"]) == set(RAW.columns)

    predictor = RawCTRPredictor()
    predictor.load_context(SimpleNamespace(artifacts=artifacts))
    found = predictor.predict(None, RAW)

    # The reference: the transform over the typed raw columns, then the model.
    table = pa.Table.from_pandas(RAW, schema=raw_schema(features), preserve_index=False)
    featurized = FeatureTransform(SPEC, STATE).apply(table)
    batch = {
        c: torch.from_numpy(
            np.asarray(featurized.column(c).to_pylist(), np.float32 if c == "dense" else np.int64)
        )
        for c in ("dense", "sparse", "seq_user_recent_items")
    }
    with torch.no_grad():
        expected = torch.sigmoid(model.eval()(batch)).numpy()
    assert found.shape == (3,)
    np.testing.assert_allclose(found, expected, rtol=1e-6)


@pytest.mark.integration  # MLflow's store and registry (SQLite): ~8 s
def test_the_registered_raw_model_has_a_raw_signature_and_scores_raw_rows(
    tmp_path: Path,
) -> None:
    import mlflow

    from trainers.serving import log_model

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    # Through a client, not mlflow.set_experiment(): that one's active experiment is global to
    # the process, and the next test's start_run(run_id=...) in another store refuses it.
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("serving")).info.run_id
    example = RAW.iloc[[0]].astype({"user_id": "int64", "position": "int64", "user_age": "int64"})
    example = example.assign(user_recent_items=[[1, 2]])
    features = ServingFeatures(SPEC, STATE, ctr_backfill().columns["backfill"], example)
    rows = layout(SPEC, STATE)
    model = build_model(ModelConfig("logistic"), rows)
    model_uri, version = log_model(
        model, rows, run_id, tracking_uri=uri, register_as="ctr-raw", features=features
    )
    mlflow.end_run()
    assert version == "1"
    loaded = mlflow.pyfunc.load_model(model_uri)
    schema = loaded.metadata.get_input_schema()
    assert schema is not None
    assert set(schema.input_names()) == set(RAW.columns)  # raw columns, not feature indices
    found = loaded.predict(example)
    assert found.shape == (1,)
    assert 0.0 < float(found[0]) < 1.0
