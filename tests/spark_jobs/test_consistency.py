"""``flow check consistency`` on a backfill channel: its rows agree with the Python transform of
their raw inputs, and a changed vocabulary or clip bound makes the check fail, naming the feature.
"""

from __future__ import annotations

import dataclasses

import pytest
from pyspark.sql import SparkSession

from flow.handoff import Channel
from flow.pipeline import BackfillStage, Numeric
from flow.pipeline.state import FeatureState
from flow.transform import FeatureTransform
from flow.transform.serving import ServingFeatures
from spark_jobs.backfill import run_backfill
from spark_jobs.consistency import check_channel
from tests.spark_jobs.test_stages import Lake

pytestmark = pytest.mark.integration


def test_a_backfill_channel_agrees_with_the_python_transform_and_a_change_is_named(
    spark: SparkSession, lake: Lake
) -> None:
    pipeline = lake.pipeline()
    stage = pipeline.stage("backfill", BackfillStage)
    _, state = run_backfill(spark, pipeline, stage, lake.stack)

    result = check_channel(spark, lake.stack, pipeline, "backfill")
    print("\n".join(result.lines()))
    assert result.ok, result.lines()
    assert (result.report.rows, result.unmatched) == (60, 0)

    # A vocabulary in another order: the rows' user_country indices are no longer the state's.
    vocabulary = state.vocabularies["user_country"]
    swapped = dataclasses.replace(
        state, vocabularies={**state.vocabularies, "user_country": vocabulary[::-1]}
    )
    changed = result.against(stage.features, swapped)
    assert not changed.ok
    assert [m.feature for m in changed.report.mismatches] == ["user_country"]
    assert "user_country (sparse)" in "\n".join(changed.lines())

    # A clip bound moved from 50 to 10: positions above 10 differ, in that feature only.
    features = stage.features
    clipped = dataclasses.replace(
        features,
        features=tuple(
            dataclasses.replace(f, clip=(1, 10)) if isinstance(f, Numeric) else f
            for f in features.features
        ),
    )
    refit = FeatureState(
        clipped.name, clipped.fingerprint, state.vocabularies, state.moments, state.boundaries
    )
    bounded = result.against(clipped, refit)
    print("\n".join(bounded.lines()))
    assert [m.feature for m in bounded.report.mismatches] == ["position"]
    assert 0 < bounded.report.mismatches[0].rows < 60  # positions 12, 30 and 50, not the rest


def test_a_backfill_channel_records_its_features_and_raw_examples_for_serving(
    spark: SparkSession, lake: Lake
) -> None:
    pipeline = lake.pipeline()
    stage = pipeline.stage("backfill", BackfillStage)
    _, state = run_backfill(spark, pipeline, stage, lake.stack)

    channel = Channel(f"{lake.stack.handoff}/{lake.ns}", "backfill")
    recorded = channel.features()
    assert recorded is not None
    features = ServingFeatures.from_dict(recorded)
    assert features.spec == stage.features
    assert features.state.version == state.version == channel.meta().feature_state
    # The features' raw inputs with the types the pipeline declares (after the enrichment).
    assert features.inputs == {
        "user_id": "long",
        "user_country": "string",
        "device": "string",
        "position": "int",
    }
    # Two rows of the lake's impressions as the stage saw them, without nulls.
    assert len(features.example) == 2
    for row in features.example:
        assert row["user_id"] in (1, 2, 3, 4)
        assert row["device"] in ("ios", "android", "web")
        assert row["user_country"] in ("us", "de", "fr")
        assert 1 <= row["position"] <= 50
    example = features.example_table()
    assert example.schema == features.schema()
    assert FeatureTransform(features.spec, features.state).apply(example).num_rows == 2
