"""The own-data pipelines (docs/own-data.md) are valid definitions over the tables that
``flow load`` and ``flow import criteo`` write; on the stack, they train, and the Python
transform of their raw inputs gives what Spark committed (``flow check consistency``)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from flow.config import StackConfig
from flow.engine import RunOptions
from flow.errors import ConfigError
from flow.pipeline import BackfillStage, IcebergSource
from flow.stack.iceberg import open_catalog
from flow.training import TrainConfig
from flow.workflows.criteo import (
    CATEGORICAL,
    COLUMNS,
    INTEGER,
    CriteoOptions,
    import_criteo,
    recorded_split,
    write_criteo_sample,
)
from pipelines.criteo import criteo
from pipelines.ratings import ratings
from tests.support import handoff_rows

AT = datetime(2024, 1, 3, tzinfo=UTC)


def test_the_ratings_pipeline_reads_what_the_guide_s_load_writes() -> None:
    pipeline = ratings()
    assert pipeline.namespace == "movies"
    source = pipeline.sources["ratings"]
    assert isinstance(source, IcebergSource)
    assert [f.name for f in source.columns] == ["user_id", "movie_id", "rating", "ts", "label"]


def test_the_criteo_pipeline_splits_its_table_by_time() -> None:
    at = AT
    pipeline = criteo("criteo.days", split=at)
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
    assert criteo("ads.criteo", AT).namespace == "ads"
    with pytest.raises(ConfigError, match=r"namespace\.table"):
        criteo("criteo", AT)


@pytest.mark.integration
def test_the_guide_s_criteo_example_trains_and_evaluates_on_the_later_rows(
    running_stack: StackConfig, tmp_path: Path
) -> None:
    from spark_jobs.consistency import check_channel
    from spark_jobs.runner import run_pipeline
    from spark_jobs.session import get_session
    from trainers.train import train

    sample = write_criteo_sample(tmp_path / "criteo.txt", rows=4000, seed=5)
    table = f"c{uuid.uuid4().hex[:8]}.days"
    start = datetime(2024, 1, 1, tzinfo=UTC)
    options = CriteoOptions(table=table, start=start, rows_per_second=1.0)
    with import_criteo(running_stack, tmp_path / "criteo.txt", options) as load:
        load.write()
    # The import's default split, recorded on the table: the first 80% train, the rest test.
    split = recorded_split(running_stack, table)
    assert split == start + timedelta(seconds=3200)
    pipeline = criteo(table, split=split)
    train_report, holdout = run_pipeline(pipeline, running_stack, RunOptions(tracking=False))
    assert (train_report.training_rows, holdout.training_rows) == (3200, 800)
    assert train_report.reconciled
    assert holdout.reconciled
    assert holdout.feature_state == train_report.feature_state  # the state fitted in the run
    handoff = f"{running_stack.handoff}/{pipeline.namespace}"
    assert handoff_rows(handoff, "test").num_rows == 800
    config = TrainConfig(
        channels=("train",),
        handoff=handoff,
        eval_channel="test",
        batch_size=256,
        epochs=1,  # one pass: every train row once (with an eval channel, up to 10 by default)
        device="cpu",
        tracking=False,
        checkpoint_dir=str(tmp_path / "checkpoints"),
    )
    result = train(config, say=lambda _: None)
    assert result.rows == 3200
    assert result.metrics["count"] == 800  # evaluated on the later rows, every one
    assert sample.clicks > 0

    # One transform, two executions: every feature of every row of both channels, matched on
    # the time (one row a second), is what the Python transform makes of the imported row.
    spark = get_session(running_stack, app_name="primus-flow-tests")
    for channel, rows in (("train", 3200), ("test", 800)):
        check = check_channel(spark, running_stack, pipeline, channel, rows=rows, key="ts")
        print("\n".join(check.lines()))
        assert check.ok, check.lines()
        assert (check.report.rows, check.report.features) == (rows, 2 + 13 + 26)


@pytest.mark.integration
def test_the_ratings_pipeline_s_features_are_the_python_transform_s(
    running_stack: StackConfig,
) -> None:
    from spark_jobs.consistency import check_channel
    from spark_jobs.runner import run_pipeline
    from spark_jobs.session import get_session

    namespace = f"r{uuid.uuid4().hex[:8]}"
    start = datetime(2024, 1, 1, tzinfo=UTC)
    rows = [
        {
            "user_id": n % 37 if n % 11 else 2**40 + n,  # large ids too: their text is hashed
            "movie_id": (n * 7) % 101,
            "rating": float(n % 5) + 0.5,
            "ts": start + timedelta(seconds=n),  # one a second: the check's key
            "label": int(n % 5 >= 3),
        }
        for n in range(500)
    ]
    schema = pa.schema(
        [
            ("user_id", pa.int64()),
            ("movie_id", pa.int64()),
            ("rating", pa.float64()),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("label", pa.int32()),
        ]
    )
    catalog = open_catalog(running_stack.catalog)
    catalog.create_namespace_if_not_exists(namespace)
    table = catalog.create_table(f"{namespace}.ratings", schema=schema)
    table.append(pa.Table.from_pylist(rows, schema=schema))
    pipeline = ratings(f"{namespace}.ratings")
    (report,) = run_pipeline(pipeline, running_stack, RunOptions(tracking=False))
    assert report.training_rows == 500

    spark = get_session(running_stack, app_name="primus-flow-tests")
    check = check_channel(spark, running_stack, pipeline, "ratings", rows=500, key="ts")
    print("\n".join(check.lines()))
    assert check.ok, check.lines()
    assert (check.report.rows, check.report.features) == (500, 4)  # label, weight, 2 hashed
