"""The raw-input pyfunc: raw event columns in, the same probabilities as the model on the
features the Python transform computes from them."""

from __future__ import annotations

import dataclasses
import gc
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

from flow.errors import ConfigError
from flow.handoff import Channel
from flow.pipeline.state import FeatureState, layout
from flow.training import ModelConfig
from flow.transform import FeatureTransform
from flow.transform.serving import ServingFeatures
from pipelines.ctr import ctr_features
from pipelines.ctr_backfill import ctr_backfill
from trainers.export import save_model
from trainers.inputs import features_of
from trainers.models import build_model
from trainers.serving import RawCTRPredictor, raw_signature, raw_table, save_features

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
    features = ServingFeatures.for_stage(ctr_backfill(), "backfill", STATE)
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
    table = pa.Table.from_pandas(RAW, schema=features.schema(), preserve_index=False)
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


def test_a_loaded_predictor_leaves_the_collector_nothing_old_to_walk(tmp_path: Path) -> None:
    """Loading freezes what is alive (trainers.export.settle_collector): a full collection
    walked half a million objects, 260 ms in the request it landed on (flow bench serve)."""
    rows = layout(SPEC, STATE)
    artifacts = {
        "model": str(save_model(build_model(ModelConfig("logistic"), rows), rows, tmp_path / "m")),
        "features": str(
            save_features(
                ServingFeatures.for_stage(ctr_backfill(), "backfill", STATE), tmp_path / "f.json"
            )
        ),
    }
    gc.unfreeze()
    try:
        RawCTRPredictor().load_context(SimpleNamespace(artifacts=artifacts))
        assert gc.get_freeze_count() > 10_000  # modules, the model, MLflow: all of them
        assert len(gc.get_objects()) < gc.get_freeze_count() / 10
    finally:
        gc.unfreeze()


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
    features = ServingFeatures.for_stage(
        ctr_backfill(), "backfill", STATE, pa.Table.from_pandas(example, preserve_index=False)
    )
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


def test_a_raw_value_of_another_type_or_a_missing_column_is_named() -> None:
    schema = ServingFeatures.for_stage(ctr_backfill(), "backfill", STATE).schema()
    typed = raw_table(RAW, schema)  # nulls in integer columns: pandas floats, back to integers
    assert typed.column("position").to_pylist() == [1, 12, None]
    with pytest.raises(ValueError, match=r"raw column 'position' holds float64.*7.5"):
        raw_table(RAW.assign(position=[7.5, 1.0, None]), schema)
    with pytest.raises(ValueError, match=r"lacks the raw column\(s\) device; send null"):
        raw_table(RAW.drop(columns="device"), schema)


def test_the_signature_types_text_and_lists_and_lets_every_value_be_null() -> None:
    features = ServingFeatures.for_stage(ctr_backfill(), "backfill", STATE)
    columns = {c.pop("name"): c for c in raw_signature(features).inputs.to_dict()}
    assert columns["device"] == {"type": "string", "required": False}
    assert columns["user_recent_items"]["items"] == {"type": "long"}
    # Numbers are typed by the predictor: MLflow refuses an integer for a double and a null
    # (a pandas float) for a long, both of which a raw impression in JSON has.
    assert columns["position"]["type"] == columns["item_price"]["type"] == "any"
    assert not any(c["required"] for c in columns.values())


def test_the_trainer_takes_the_features_its_channels_recorded(tmp_path: Path) -> None:
    from tests.trainers.channels import SCHEMA

    plain = ServingFeatures.for_stage(ctr_backfill(), "backfill", STATE).to_dict()
    with_rows = ServingFeatures.for_stage(
        ctr_backfill(), "backfill", STATE, pa.Table.from_pandas(RAW, preserve_index=False)
    ).to_dict()
    root = str(tmp_path)
    Channel(root, "backfill").create(SCHEMA, num_buckets=2, features=plain)
    Channel(root, "live").create(SCHEMA, num_buckets=2, features=with_rows)
    found, why = features_of(root, ("backfill", "live", "later"))  # "later": not written yet
    assert found is not None, why
    assert found.state.version == STATE.version
    assert len(found.example) == 2  # the first channel that holds examples gives them

    Channel(root, "old").create(SCHEMA, num_buckets=2)
    found, why = features_of(root, ("backfill", "old"))
    assert found is None
    assert "channel 'old' records no features" in why

    # Refitted cut points: the same layout, other buckets.
    other = dataclasses.replace(STATE, boundaries={"price_bucket": [1.0, 2.0, 3.0]})
    Channel(root, "refit").create(
        SCHEMA,
        num_buckets=2,
        features=ServingFeatures.for_stage(ctr_backfill(), "backfill", other).to_dict(),
    )
    with pytest.raises(ConfigError, match="different feature states"):
        features_of(root, ("backfill", "refit"))


def test_a_spec_of_hashed_ids_only_scores_raw_rows(tmp_path: Path) -> None:
    """No dense block (the ratings pipeline's features): the transform leaves it as lists of
    nothing, which the model does not read."""
    from pipelines.ratings import ratings

    pipeline = ratings()
    spec = pipeline.stages[0].features
    state = FeatureState(spec.name, spec.fingerprint)
    features = ServingFeatures.for_stage(pipeline, "backfill", state)
    rows = layout(spec, state)
    predictor = RawCTRPredictor()
    predictor.prepare(features)
    predictor.layout, predictor.model = rows, build_model(ModelConfig("logistic"), rows).eval()
    found = predictor.predict(None, pd.DataFrame({"user_id": [1, None], "movie_id": [5, 6]}))
    assert found.shape == (2,)
