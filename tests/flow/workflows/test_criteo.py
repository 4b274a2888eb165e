"""``flow import criteo`` on a generated sample (no services): types, nulls where fields were
empty, made event times, and files that are not Criteo files refused with what is wrong."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from flow.config import StackConfig
from flow.errors import ConfigError, LoadError
from flow.stack.iceberg import open_catalog
from flow.workflows.criteo import (
    CATEGORICAL,
    INTEGER,
    CriteoOptions,
    import_criteo,
    write_criteo_sample,
)
from tests.support import stack_env_for

START = datetime(2024, 1, 1, tzinfo=UTC)


@pytest.fixture
def stack(tmp_path: Path) -> StackConfig:
    return StackConfig.from_env(stack_env_for(tmp_path / "home"))


def imported(stack: StackConfig, path: Path, options: CriteoOptions) -> pa.Table:
    opened = import_criteo(stack, path, options)
    try:
        opened.write()
    finally:
        opened.close()
    return open_catalog(stack.catalog).load_table(options.table).scan().to_arrow()


@pytest.mark.parametrize("name", ["sample.txt", "sample.txt.gz"])
def test_a_sample_round_trips_counts_nulls_and_types(
    stack: StackConfig, tmp_path: Path, name: str
) -> None:
    sample = write_criteo_sample(tmp_path / name, 3_000, missing=0.2, seed=4)
    rows = imported(
        stack,
        tmp_path / name,
        CriteoOptions("criteo.days", start=START, rows_per_second=2, row_index=True),
    )
    assert rows.num_rows == sample.rows
    assert sum(rows.column("label").to_pylist()) == sample.clicks
    for column in (*INTEGER, *CATEGORICAL):
        assert rows.column(column).null_count == sample.missing[column], column
    assert rows.schema.field("label").type == pa.int32()
    assert rows.schema.field("i1").type == pa.int64()
    assert pa.types.is_string(rows.schema.field("c1").type) or pa.types.is_large_string(
        rows.schema.field("c1").type
    )
    ordered = rows.sort_by("row_id")
    assert ordered.column("row_id").to_pylist() == list(range(3_000))
    assert ordered.column("ts")[0].as_py() == START
    assert ordered.column("ts")[2_999].as_py() == START + timedelta(seconds=1_499.5)
    assert all(len(v) == 8 for v in rows.column("c3").drop_null().to_pylist())


def test_the_sample_s_clicks_follow_its_model(tmp_path: Path) -> None:
    sample = write_criteo_sample(tmp_path / "s.txt", 20_000, seed=9)
    assert abs(sample.clicks - sample.p_click.sum()) < 4 * sample.p_click.sum() ** 0.5


def test_lines_that_are_not_criteo_lines_are_refused(stack: StackConfig, tmp_path: Path) -> None:
    short = tmp_path / "short.txt"
    short.write_text("1\t2\t3\n")
    with pytest.raises(LoadError, match=r"40 tab-separated fields"):
        imported(stack, short, CriteoOptions("criteo.bad"))
    labels = tmp_path / "labels.txt"
    fields = ["", *[""] * 13, *[""] * 26]
    labels.write_text("\t".join(["0", *fields[1:]]) + "\n" + "\t".join(["2", *fields[1:]]) + "\n")
    with pytest.raises(LoadError, match=r"row 2: label 2 is not 0 or 1"):
        imported(stack, labels, CriteoOptions("criteo.bad"))


def test_an_event_time_needs_both_its_start_and_its_spacing() -> None:
    with pytest.raises(ConfigError, match=r"--start and --rows-per-second go together"):
        CriteoOptions("criteo.days", start=START)
    with pytest.raises(ConfigError, match=r"has no zone"):
        CriteoOptions("criteo.days", start=datetime(2024, 1, 1), rows_per_second=1)
