"""The own-data pipelines (docs/own-data.md) are valid definitions over the tables that
``flow load`` and ``flow import criteo`` write (no Spark: the definitions only)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from flow.config import StackConfig
from flow.engine import RunOptions
from flow.errors import ConfigError
from flow.pipeline import BackfillStage, IcebergSource
from flow.training import TrainConfig
from flow.workflows.criteo import (
    CATEGORICAL,
    COLUMNS,
    INTEGER,
    CriteoOptions,
    import_criteo,
    write_criteo_sample,
)
from pipelines.criteo import criteo
from pipelines.ratings import ratings
from tests.support import handoff_rows


def test_the_ratings_pipeline_reads_what_the_guide_s_load_writes() -> None:
    pipeline = ratings()
    assert pipeline.namespace == "movies"
    source = pipeline.sources["ratings"]
    assert isinstance(source, IcebergSource)
    assert [f.name for f in source.columns] == ["user_id", "movie_id", "rating", "ts", "label"]


def test_the_criteo_pipeline_splits_its_table_by_time() -> None:
    at = datetime(2024, 1, 3, tzinfo=UTC)
    pipeline = criteo(split=at)
    before, after = pipeline.sources["days"], pipeline.sources["days_after"]
    assert isinstance(before, IcebergSource)
    assert isinstance(after, IcebergSource)
    assert before.end == after.start == at
    assert [f.name for f in before.columns] == [*COLUMNS, "ts"]
    train = pipeline.stage("train", BackfillStage)
    held = pipeline.stage("train_holdout", BackfillStage)
    assert train.fit
    assert not held.fit
    assert (held.events, held.channel, held.features) == ("days_after", "test", train.features)
    assert len(train.features.features) == len(INTEGER) + len(CATEGORICAL)


def test_a_criteo_table_elsewhere_keeps_its_namespace() -> None:
    assert criteo("ads.criteo").namespace == "ads"
    with pytest.raises(ConfigError, match=r"namespace\.table"):
        criteo("criteo")


@pytest.mark.integration
def test_the_guide_s_criteo_example_trains_and_evaluates_on_the_later_rows(
    running_stack: StackConfig, tmp_path: Path
) -> None:
    from spark_jobs.runner import run_pipeline
    from trainers.train import train

    sample = write_criteo_sample(tmp_path / "criteo.txt", rows=4000, seed=5)
    table = f"c{uuid.uuid4().hex[:8]}.days"
    start = datetime(2024, 1, 1, tzinfo=UTC)
    options = CriteoOptions(table=table, start=start, rows_per_second=1.0)
    with import_criteo(running_stack, tmp_path / "criteo.txt", options) as load:
        load.write()
    split = start + timedelta(seconds=3000)  # the first 3,000 rows train, the last 1,000 test
    pipeline = criteo(table, split=split)
    train_report, holdout = run_pipeline(pipeline, running_stack, RunOptions(tracking=False))
    assert (train_report.training_rows, holdout.training_rows) == (3000, 1000)
    assert train_report.reconciled
    assert holdout.reconciled
    assert holdout.feature_state == train_report.feature_state  # the state fitted in the run
    handoff = f"{running_stack.handoff}/{pipeline.namespace}"
    assert handoff_rows(handoff, "test").num_rows == 1000
    config = TrainConfig(
        channels=("train",),
        handoff=handoff,
        eval_channel="test",
        batch_size=256,
        device="cpu",
        tracking=False,
        checkpoint_dir=str(tmp_path / "checkpoints"),
    )
    result = train(config, say=lambda _: None)
    assert result.rows == 3000
    assert result.metrics["count"] == 1000  # evaluated on the later rows, every one
    assert sample.clicks > 0
