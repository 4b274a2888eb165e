"""The own-data pipelines (docs/own-data.md) are valid definitions over the tables that
``flow load`` and ``flow import criteo`` write (no Spark: the definitions only)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from flow.errors import ConfigError
from flow.pipeline import BackfillStage, IcebergSource
from flow.workflows.criteo import CATEGORICAL, COLUMNS, INTEGER
from pipelines.criteo import criteo
from pipelines.ratings import ratings


def test_the_ratings_pipeline_reads_what_the_guide_s_load_writes() -> None:
    pipeline = ratings()
    assert pipeline.namespace == "movies"
    source = pipeline.sources["ratings"]
    assert isinstance(source, IcebergSource)
    assert [f.name for f in source.columns] == ["user_id", "movie_id", "rating", "ts", "label"]


def test_the_criteo_pipeline_splits_its_table_by_time() -> None:
    pipeline = criteo(split=datetime(2024, 1, 3, tzinfo=UTC))
    before, after = pipeline.sources["before"], pipeline.sources["after"]
    assert isinstance(before, IcebergSource)
    assert isinstance(after, IcebergSource)
    assert before.end == after.start == datetime(2024, 1, 3, tzinfo=UTC)
    assert [f.name for f in before.columns] == [*COLUMNS, "ts"]
    train = pipeline.stage("train", BackfillStage)
    assert train.fit
    assert not pipeline.stage("test", BackfillStage).fit
    assert len(train.features.features) == len(INTEGER) + len(CATEGORICAL)


def test_a_criteo_table_elsewhere_keeps_its_namespace() -> None:
    assert criteo("ads.criteo").namespace == "ads"
    with pytest.raises(ConfigError, match=r"namespace\.table"):
        criteo("criteo")
