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
    recorded_split,
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


def test_a_short_line_is_named_by_its_line_number(stack: StackConfig, tmp_path: Path) -> None:
    path = tmp_path / "cut.txt"
    write_criteo_sample(path, 2_000, seed=2)
    lines = path.read_text().splitlines(keepends=True)
    lines[1_500] = "\t".join(lines[1_500].split("\t")[:38]) + "\n"
    path.write_text("".join(lines))
    with pytest.raises(LoadError, match=r"cut.txt: line 1,501: Expected 40 columns, got 38"):
        imported(stack, path, CriteoOptions("criteo.cut", file_rows=500))
    assert not open_catalog(stack.catalog).table_exists("criteo.cut")


@pytest.mark.parametrize(
    ("split_at", "train"),
    [
        (None, 800),  # the default: the first 80% of the rows
        (0.25, 250),
        (START + timedelta(seconds=300), 600),  # two rows a second
    ],
)
def test_the_train_test_split_is_recorded_on_the_table_for_any_file_size(
    stack: StackConfig, tmp_path: Path, split_at: datetime | float | None, train: int
) -> None:
    write_criteo_sample(tmp_path / "small.txt", 1_000, seed=6)
    options = CriteoOptions("criteo.days", start=START, rows_per_second=2, split_at=split_at)
    opened = import_criteo(stack, tmp_path / "small.txt", options)
    try:
        report = opened.write()
    finally:
        opened.close()
    assert f"{train:,} rows train, {1_000 - train:,} test" in report.message
    split = recorded_split(stack, "criteo.days")
    times = open_catalog(stack.catalog).load_table("criteo.days").scan().to_arrow()["ts"]
    assert sum(t < split for t in times.to_pylist()) == train


def test_a_split_with_nothing_on_one_side_writes_nothing(
    stack: StackConfig, tmp_path: Path
) -> None:
    write_criteo_sample(tmp_path / "small.txt", 1_000, seed=6)
    late = START + timedelta(days=1)  # after the last of 1,000 rows at one a second
    options = CriteoOptions("criteo.days", start=START, rows_per_second=1, split_at=late)
    with pytest.raises(LoadError, match=r"puts all of the 1,000 rows before it"):
        imported(stack, tmp_path / "small.txt", options)
    assert not open_catalog(stack.catalog).table_exists("criteo.days")
    with pytest.raises(ConfigError, match=r"records no train/test split|does not exist"):
        recorded_split(stack, "criteo.days")


def test_a_split_needs_event_times_and_a_share_between_0_and_1() -> None:
    with pytest.raises(ConfigError, match=r"--split-at splits the rows by event time"):
        CriteoOptions("criteo.days", split_at=0.8)
    with pytest.raises(ConfigError, match=r"between 0 and 1"):
        CriteoOptions("criteo.days", start=START, rows_per_second=1, split_at=1.5)


def test_an_append_keeps_the_table_s_split_unless_given_one(
    stack: StackConfig, tmp_path: Path
) -> None:
    write_criteo_sample(tmp_path / "a.txt", 1_000, seed=6)
    first = CriteoOptions("criteo.days", start=START, rows_per_second=1)
    imported(stack, tmp_path / "a.txt", first)
    split = recorded_split(stack, "criteo.days")
    assert split == START + timedelta(seconds=800)
    later = START + timedelta(seconds=1_000)
    more = CriteoOptions("criteo.days", start=later, rows_per_second=1, mode="append")
    imported(stack, tmp_path / "a.txt", more)
    assert recorded_split(stack, "criteo.days") == split
    given = later + timedelta(seconds=500)
    again = CriteoOptions(
        "criteo.days", start=later, rows_per_second=1, mode="append", split_at=given
    )
    imported(stack, tmp_path / "a.txt", again)
    assert recorded_split(stack, "criteo.days") == given
