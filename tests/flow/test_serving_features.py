"""What a channel records of its features for a model serving on raw events
(flow.transform.serving.ServingFeatures, Channel.features)."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from flow.handoff import Channel
from flow.pipeline import Hashed
from flow.pipeline.state import FeatureState
from flow.transform import FeatureTransform
from flow.transform.serving import ServingFeatures
from pipelines.ctr_backfill import ctr_backfill
from tests.trainers.test_serving import RAW, STATE

SCHEMA = pa.schema([("label", pa.float32())])


def _features() -> ServingFeatures:
    example = pa.Table.from_pandas(RAW, preserve_index=False)
    return ServingFeatures.for_stage(ctr_backfill(), "backfill", STATE, example)


def test_a_stage_s_features_travel_as_plain_data_with_typed_raw_examples() -> None:
    features = _features()
    assert features.servable
    assert features.inputs["user_id"] == "long"
    assert features.inputs["user_recent_items"] == "array<long>"
    assert list(features.inputs) == FeatureTransform(features.spec, STATE).inputs
    assert len(features.example) == 2  # of RAW's three rows
    assert features.example[0]["device"] == "ios"

    again = ServingFeatures.from_json(json.dumps(json.loads(features.to_json())))
    assert again == features
    example = again.example_table()
    assert example.schema == again.schema()
    assert example.column("user_id").to_pylist() == [7, 8]
    assert example.column("user_recent_items").to_pylist() == [[1, 2, None], None]


def test_an_instant_in_an_example_comes_back_as_the_same_instant() -> None:
    spec = dataclasses.replace(
        ctr_backfill().stages[0].features, features=(Hashed("user_id", buckets=8),)
    )
    state = FeatureState(spec.name, spec.fingerprint)
    at = datetime(2026, 3, 1, 12, 30, tzinfo=UTC)
    features = ServingFeatures(spec, state, {"user_id": "long", "ts": "timestamp"}, ())
    features = dataclasses.replace(features, example=({"user_id": 1, "ts": at.isoformat()},))
    assert features.example_table().column("ts").to_pylist() == [at]


def test_features_a_python_transform_cannot_compute_are_recorded_with_the_reason() -> None:
    pipeline = ctr_backfill()
    stage = pipeline.stages[0]
    spec = dataclasses.replace(
        stage.features, features=(Hashed("item_price", buckets=8, name="p"),)
    )
    built = dataclasses.replace(pipeline, stages=(dataclasses.replace(stage, features=spec),))
    state = FeatureState(spec.name, spec.fingerprint)
    features = ServingFeatures.for_stage(built, "backfill", state)
    assert not features.servable
    (reason,) = features.outside_spark
    assert "feature 'p' hashes or looks up 'item_price', a double column" in reason


def test_a_channel_keeps_the_features_it_was_created_with(tmp_path: Path) -> None:
    plain = _features().to_dict()
    channel = Channel(str(tmp_path), "c")
    channel.create(SCHEMA, num_buckets=2, features=plain)
    assert Channel(str(tmp_path), "c").features() == json.loads(json.dumps(plain))
    # Opened again by a writer with other features: the channel's rows are of the first.
    other = {**plain, "inputs": {}}
    Channel(str(tmp_path), "c").create(SCHEMA, num_buckets=2, features=other)
    assert Channel(str(tmp_path), "c").features() == json.loads(json.dumps(plain))
    # A channel written without (by write_table, or before channels recorded them): none.
    Channel(str(tmp_path), "plain").create(SCHEMA, num_buckets=2)
    assert Channel(str(tmp_path), "plain").features() is None
