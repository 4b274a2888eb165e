"""The Python feature transform's pieces without Spark: values Spark 4.1 gave, and the report.

The transform as a whole is held to Spark SQL in tests/spark_jobs/test_transform_parity.py.
"""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest

from flow.errors import ConfigError
from flow.pipeline import FeatureSpec, Field, Hashed, Numeric, Vocabulary
from flow.pipeline.columns import outside_spark
from flow.pipeline.features import spec_from_dict, spec_to_dict
from flow.pipeline.state import FeatureState
from flow.transform import FeatureTransform
from flow.transform.consistency import compare
from flow.transform.spark_semantics import log1p, xxhash64


def test_xxhash64_is_sparks_chained_xxh64_with_nulls_skipped() -> None:
    # SELECT xxhash64('user_id', '42'), xxhash64('x', CAST(NULL AS STRING), 'y') on Spark 4.1
    assert xxhash64(b"user_id", b"42") == 2536563327309846858
    assert xxhash64(b"x", None, b"y") == -3274121240623841382
    # 1 + pmod(xxhash64('taste_x_category', 'books', '\u0000'), 1023): a Cross with a null part
    assert 1 + xxhash64(b"taste_x_category", b"books", b"\x00") % 1023 == 560


@pytest.mark.parametrize(
    ("x", "spark"),
    # Inputs where numpy's log1p was one bit off Spark's (StrictMath, fdlibm) on the machine
    # they were found on. numpy picks its log1p by the CPU (a SIMD one where AVX-512 is found,
    # else the C library's, which agrees with Spark on these: an AMD EPYC without AVX-512 on
    # 2026-12-07). That is why fdlibm is transcribed: these come out as Spark's on every machine.
    [
        ("0x1.92c328bd25704p+2", "0x1.fca7e9896dcb8p+0"),
        ("0x1.8b9bc2cbcf2c9p-1", "0x1.251d3409ae0d0p-1"),
        ("0x1.fc977861f4719p-3", "0x1.c644ff523e5a8p-3"),
    ],
)
def test_log1p_is_strictmath_bit_for_bit(x: str, spark: str) -> None:
    assert log1p(float.fromhex(x)) == float.fromhex(spark)


def test_log1p_edges() -> None:
    assert log1p(0.0) == 0.0
    assert math.copysign(1, log1p(-0.0)) == -1
    assert log1p(math.inf) == math.inf
    assert math.isnan(log1p(math.nan))
    assert log1p(-1.0) == -math.inf


SPEC = FeatureSpec(
    name="t",
    features=(
        Numeric("age", clip=(16, 90)),
        Vocabulary("country"),
        Hashed("score", buckets=10),
    ),
)
STATE = FeatureState("t", SPEC.fingerprint, {"country": ["de", "fr"]}, {"age": (40.0, 10.0)})


def test_transform_of_raw_rows() -> None:
    raw = pa.table({"age": [10, None, 95], "country": ["fr", None, "xx"], "score": [1, 2, None]})
    rows = FeatureTransform(SPEC, STATE).apply(raw).to_pydict()
    assert rows["dense"] == [[-2.4000000953674316], [0.0], [5.0]]  # clipped; null: the mean
    assert [s[0] for s in rows["sparse"]] == [2, 0, 0]  # fr; null and unknown: 0
    assert rows["sparse"][2][1] == 0
    assert 1 <= rows["sparse"][0][1] < 10


def test_id_features_pass_their_raw_ids_and_a_null_becomes_the_null_id() -> None:
    from flow.pipeline import Id
    from flow.pipeline.features import NULL_ID

    spec = FeatureSpec(name="ids", features=(Id("user"), Id("item", name="thing")))
    state = FeatureState("ids", spec.fingerprint)
    raw = pa.table({"user": [2**62 + 1, None], "item": pa.array([7, -3], pa.int32())})
    rows = FeatureTransform(spec, state).apply(raw)
    assert rows.column("ids").to_pylist() == [[2**62 + 1, 7], [NULL_ID, -3]]
    assert compare(spec, rows, rows).lines() == ["2 rows, 3 features: 0 mismatches"]  # + weight


def test_transform_names_missing_columns() -> None:
    with pytest.raises(ConfigError, match="reads column\\(s\\) score"):
        FeatureTransform(SPEC, STATE).apply(pa.table({"age": [1], "country": ["de"]}))


def test_a_double_hashed_cannot_run_outside_spark() -> None:
    columns = {"score": Field("score", "double"), "country": Field("country", "string")}
    (reason,) = outside_spark(SPEC, columns)
    assert "'score'" in reason
    assert "double" in reason


def test_compare_names_the_feature_that_differs() -> None:
    raw = pa.table({"age": [20, 30], "country": ["de", "fr"], "score": [1, 2]})
    spark = FeatureTransform(SPEC, STATE).apply(raw)
    other = FeatureState("t", SPEC.fingerprint, {"country": ["fr", "de"]}, {"age": (40.0, 10.0)})
    report = compare(SPEC, spark, FeatureTransform(SPEC, other).apply(raw), ["a", "b"])
    assert not report.ok
    assert [m.feature for m in report.mismatches] == ["country"]
    assert report.mismatches[0].examples[0] == {"key": "a", "spark": 1, "python": 2}
    assert compare(SPEC, spark, spark).lines() == [
        "2 rows, 4 features: 0 mismatches"
    ]  # and the weight


def test_a_spec_travels_as_plain_data_with_its_fingerprint() -> None:
    from pipelines.ctr import ctr_features

    spec = ctr_features()
    again = spec_from_dict(json.loads(json.dumps(spec_to_dict(spec))))
    assert again == spec
    assert again.fingerprint == spec.fingerprint


def test_for_stage_refuses_a_stage_that_hashes_a_double() -> None:
    import dataclasses

    from pipelines.ctr_backfill import ctr_backfill

    pipeline = ctr_backfill()
    stage = pipeline.stages[0]
    spec = dataclasses.replace(
        stage.features, features=(Hashed("item_price", buckets=8, name="p"),)
    )
    built = dataclasses.replace(pipeline, stages=(dataclasses.replace(stage, features=spec),))
    state = FeatureState(spec.name, spec.fingerprint)
    with pytest.raises(ConfigError, match="cannot be featurized outside Spark: feature 'p'"):
        FeatureTransform.for_stage(built, "backfill", state)
    assert FeatureTransform.for_stage(pipeline, "backfill", _ctr_state()).inputs[0] == "user_id"


def _ctr_state() -> FeatureState:
    from tests.trainers.test_serving import STATE

    return STATE
