from __future__ import annotations

from pathlib import Path

import pytest

from flow.errors import ConfigError
from flow.pipeline import (
    Bucketized,
    FeatureSpec,
    Hashed,
    HashedSequence,
    Numeric,
    Vocabulary,
    layout,
)
from flow.pipeline.state import FeatureState
from flow.storage import location

SPEC = FeatureSpec(
    "ctr",
    (
        Hashed("user_id", buckets=1000),
        Vocabulary("country"),
        Bucketized("price", buckets=4),
        Numeric("age"),
        Numeric("score", standardize=False, fill=0.0),
        HashedSequence("recent", max_length=5, buckets=64),
    ),
)


def fitted() -> FeatureState:
    return FeatureState(
        "ctr",
        SPEC.fingerprint,
        vocabularies={"country": ["us", "de", "fr"]},
        moments={"age": (35.0, 10.0)},
        boundaries={"price": [1.0, 5.0, 20.0]},
        fitted_on={"rows": 10},
    )


def test_states_round_trip_and_the_version_is_their_content(tmp_path: Path) -> None:
    state = fitted()
    root = location(str(tmp_path))
    state.save(root)
    state.make_latest(root)
    loaded = FeatureState.load(root, SPEC)
    assert loaded == state
    assert loaded.version == state.version
    relabelled = FeatureState(**{**state.__dict__, "fitted_on": {"rows": 99}})
    assert relabelled.version == state.version, "lineage is not part of the version"


def test_loading_names_what_is_missing(tmp_path: Path) -> None:
    root = location(str(tmp_path))
    with pytest.raises(ConfigError, match="run the pipeline's batch stage"):
        FeatureState.load(root, SPEC)
    fitted().save(root)
    with pytest.raises(ConfigError, match=r"state 0000 of spec 'ctr' is not in .*versions there"):
        FeatureState.load(root, SPEC, version="0000")


def test_a_state_for_another_spec_is_refused(tmp_path: Path) -> None:
    root = location(str(tmp_path))
    state = fitted()
    state.save(root)
    state.make_latest(root)
    changed = FeatureSpec("ctr", (*SPEC.features, Hashed("item_id", buckets=10)))
    with pytest.raises(ConfigError, match="fitted for another version of spec 'ctr'"):
        FeatureState.load(root, changed)


def test_a_tampered_state_file_is_detected(tmp_path: Path) -> None:
    root = location(str(tmp_path))
    state = fitted()
    path = Path(state.save(root))
    path.write_text(path.read_text().replace('"de"', '"dk"'))
    with pytest.raises(ConfigError, match="is corrupt"):
        FeatureState.load(root, SPEC, version=state.version)


def test_a_saved_state_becomes_the_latest_only_when_made_so(tmp_path: Path) -> None:
    # A stage saves what it fitted at once (its commit names the version) and moves LATEST
    # only once its outputs are written: a failed stage leaves the last good state LATEST.
    root = location(str(tmp_path))
    good = fitted()
    good.save(root)
    good.make_latest(root)
    refit = FeatureState(**{**good.__dict__, "vocabularies": {"country": ["fr"]}})
    refit.save(root)
    assert FeatureState.load(root, SPEC) == good
    assert FeatureState.load(root, SPEC, version=refit.version) == refit
    refit.make_latest(root)
    assert FeatureState.load(root, SPEC) == refit
    unsaved = FeatureState(**{**good.__dict__, "vocabularies": {"country": ["it"]}})
    with pytest.raises(ConfigError, match=f"{unsaved.version} is not saved"):
        unsaved.make_latest(root)


def test_the_layout_sizes_every_block_from_spec_and_state() -> None:
    rows = layout(SPEC, fitted())
    assert rows.dense == ("age", "score")
    # vocabulary: 3 values + OOV; bucketized: 3 cut points -> 4 buckets + null
    assert rows.sparse == (("user_id", 1000), ("country", 4), ("price", 5))
    assert rows.sequences == (("recent", 64, 5),)
    with pytest.raises(ConfigError, match="a FeatureState is needed"):
        layout(SPEC, None)
