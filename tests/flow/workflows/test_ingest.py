"""``flow load``'s workflow on a local SQL catalog (no services): files of each format with
timezone-less, nanosecond and epoch times read back as the instants meant; bad input refused
with the column, the row, the value and the option to change; a failed load changes nothing."""

from __future__ import annotations

import gzip
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from flow.config import StackConfig
from flow.errors import ConfigError, LoadError
from flow.stack.iceberg import open_catalog
from flow.workflows.ingest import LoadOptions, LoadReport, load_file
from flow.workflows.timestamps import TimeRules
from tests.support import stack_env_for

NOON_UTC = datetime(2024, 5, 1, 12, tzinfo=UTC)


@pytest.fixture
def stack(tmp_path: Path) -> StackConfig:
    return StackConfig.from_env(stack_env_for(tmp_path / "home"))


def load(stack: StackConfig, path: Path, table: str = "mine.events", **options) -> LoadReport:
    opened = load_file(stack, path, LoadOptions(table, **options))
    try:
        return opened.write()
    finally:
        opened.close()


def rows(stack: StackConfig, table: str = "mine.events") -> list[dict[str, object]]:
    data = open_catalog(stack.catalog).load_table(table).scan().to_arrow()
    return sorted(data.to_pylist(), key=lambda r: tuple(str(v) for v in r.values()))


def test_csv_zone_less_times_are_read_in_the_given_zone_and_epoch_seconds_in_theirs(
    stack: StackConfig, tmp_path: Path
) -> None:
    path = tmp_path / "events.csv"
    path.write_text(
        "id,local,zoned,epoch\n"
        "1,2024-05-01 14:00:00,2024-05-01T12:00:00Z,1714564800\n"
        "2,2024-05-01T14:00:00.123456,2024-05-01T14:00:00+02:00,1714564800\n"
    )
    report = load(
        stack,
        path,
        timestamp_columns=("local", "zoned", "epoch"),
        time=TimeRules(timezone="Europe/Paris", epoch_unit="s"),
    )
    assert report.rows == 2
    first, second = rows(stack)
    assert first == {"id": 1, "local": NOON_UTC, "zoned": NOON_UTC, "epoch": NOON_UTC}
    assert second["local"] == NOON_UTC.replace(microsecond=123456)
    assert second["zoned"] == NOON_UTC
    table = open_catalog(stack.catalog).load_table("mine.events")
    assert str(table.schema().find_field("local").field_type) == "timestamptz"


def test_pandas_nanosecond_parquet_loads_truncated_to_microseconds(
    stack: StackConfig, tmp_path: Path
) -> None:
    frame = pd.DataFrame(
        {
            "user": [1, 2],
            "seen": pd.to_datetime(
                ["2024-05-01 12:00:00.000001999", "2024-05-01 12:00:00.000000000"]
            ),
            "kind": pd.Categorical(["a", "b"]),
        }
    )
    frame.to_parquet(tmp_path / "events.parquet")
    assert pq.read_schema(tmp_path / "events.parquet").field("seen").type.unit == "ns"
    report = load(stack, tmp_path / "events.parquet")
    assert report.truncated == {"seen": 1}
    got = {r["user"]: r for r in rows(stack)}
    assert got[1]["seen"] == NOON_UTC.replace(microsecond=1)
    assert got[2]["seen"] == NOON_UTC
    assert got[1]["kind"] == "a"


def test_json_lines_keep_zone_offsets_and_take_epoch_milliseconds(
    stack: StackConfig, tmp_path: Path
) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(
        '{"id": 1, "at": "2024-05-01T14:00:00+02:00", "ms": 1714564800000}\n'
        '{"id": 2, "at": "2024-05-01T12:00:00Z", "ms": 1714564800000}\n'
    )
    # pyarrow alone would read +02:00 as a zone-less 12:00, which --timezone would shift.
    load(
        stack,
        path,
        timestamp_columns=("ms",),
        time=TimeRules(timezone="America/New_York", epoch_unit="ms"),
    )
    assert [(r["at"], r["ms"]) for r in rows(stack)] == [(NOON_UTC, NOON_UTC)] * 2


def test_a_large_file_is_read_in_batches_with_progress(stack: StackConfig, tmp_path: Path) -> None:
    path = tmp_path / "big.csv"
    path.write_text(
        "n,ts\n" + "".join(f"{n},2024-05-01 12:00:{n % 60:02d}\n" for n in range(20_000))
    )
    seen: list[tuple[int, int, int | None]] = []
    opened = load_file(stack, path, LoadOptions("mine.big", block_bytes=64 * 1024, file_rows=5_000))
    try:
        report = opened.write(lambda rows, done, total: seen.append((rows, done, total)))
    finally:
        opened.close()
    assert report.rows == 20_000
    assert report.files == 4, "batches are gathered into files of file_rows"
    written = [r for r, _, _ in seen]
    assert written == sorted(written)
    assert written[-1] == 20_000
    assert len(written) == 4
    assert [done for _, done, _ in seen] == sorted(done for _, done, _ in seen)
    assert seen[-1][1] == seen[-1][2] == path.stat().st_size
    assert len(rows(stack, "mine.big")) == 20_000


def test_label_rename_and_types_make_a_table_a_pipeline_can_name(
    stack: StackConfig, tmp_path: Path
) -> None:
    path = tmp_path / "ratings.csv"
    path.write_text("userId,movieId,rating,timestamp\n1,10,4.5,1714564800\n2,11,3.0,1714564800\n")
    opened = load_file(
        stack,
        path,
        LoadOptions(
            "movies.ratings",
            timestamp_columns=("timestamp",),
            time=TimeRules(epoch_unit="s"),
            renames={"userId": "user_id", "movieId": "movie_id", "timestamp": "ts"},
            types={"movieId": "string"},
            label="rating>=4",
        ),
    )
    try:
        plan = opened.plan
        assert not plan.hints
        assert {c.name: c.field_type for c in plan.columns} == {
            "user_id": "long",
            "movie_id": "string",
            "rating": "double",
            "ts": "timestamp",
            "label": "int",
        }
        opened.write()
    finally:
        opened.close()
    assert [(r["movie_id"], r["label"]) for r in rows(stack, "movies.ratings")] == [
        ("10", 1),
        ("11", 0),
    ]


def test_camel_case_columns_get_a_rename_hint(stack: StackConfig, tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text("userId,Rating Date\n1,2024-05-01\n")
    opened = load_file(stack, path, LoadOptions("mine.r"))
    try:
        hints = " ".join(opened.plan.hints)
    finally:
        opened.close()
    assert "--rename 'userId=user_id'" in hints
    assert "--rename 'Rating Date=rating_date'" in hints


def test_an_unparsable_time_names_its_column_row_and_value(
    stack: StackConfig, tmp_path: Path
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("id,ts\n1,2024-05-01 12:00:00\n2,01/05/2024 12:00\n")
    with pytest.raises(LoadError, match=r"column 'ts', row 2: '01/05/2024 12:00' is not a time"):
        load(stack, path, timestamp_columns=("ts",))


def test_epoch_numbers_need_their_unit_and_a_wrong_unit_is_caught(
    stack: StackConfig, tmp_path: Path
) -> None:
    path = tmp_path / "epoch.csv"
    path.write_text("id,ts\n1,1714564800000\n")
    with pytest.raises(LoadError, match=r"epoch time: pass --epoch-unit"):
        load(stack, path, timestamp_columns=("ts",))
    with pytest.raises(
        LoadError, match=r"row 1: 1714564800000 .* looks like ms: pass --epoch-unit ms"
    ):
        load(stack, path, timestamp_columns=("ts",), time=TimeRules(epoch_unit="s"))
    with pytest.raises(ConfigError, match=r"--timestamp-columns"):
        LoadOptions("mine.events", time=TimeRules(epoch_unit="s"))


def test_a_time_a_clock_change_skips_is_an_error_unless_dst_says_which(
    stack: StackConfig, tmp_path: Path
) -> None:
    path = tmp_path / "dst.csv"
    path.write_text("id,ts\n1,2024-03-31 01:30:00\n2,2024-03-31 02:30:00\n")
    paris = TimeRules(timezone="Europe/Paris")
    with pytest.raises(LoadError, match=r"row 2: 2024-03-31 02:30:00 does not exist .* --dst"):
        load(stack, path, time=paris)
    load(stack, path, time=TimeRules(timezone="Europe/Paris", dst="earliest"))
    assert len(rows(stack)) == 2


def test_unknown_columns_and_zones_are_refused_with_what_exists(
    stack: StackConfig, tmp_path: Path
) -> None:
    path = tmp_path / "r.csv"
    path.write_text("user_id,rated_at\n1,2024-05-01\n")
    with pytest.raises(LoadError, match=r"has no column 'rated'.*did you mean 'rated_at'"):
        load(stack, path, timestamp_columns=("rated",))
    with pytest.raises(ConfigError, match=r"not a time zone"):
        TimeRules(timezone="Paris")
    with pytest.raises(ConfigError, match=r"name it namespace.table"):
        LoadOptions("events")


def test_an_existing_table_needs_append_or_replace(stack: StackConfig, tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("id,v\n1,a\n")
    load(stack, path)
    with pytest.raises(LoadError, match=r"exists; pass --append .* or --replace"):
        load(stack, path)
    load(stack, path, mode="append")
    assert len(rows(stack)) == 2
    other = tmp_path / "b.csv"
    other.write_text("id,w\n7,b\n")
    with pytest.raises(
        LoadError,
        match=r"the table has no column.s. w \(--add-columns .*; the file has no column.s. v",
    ):
        load(stack, other, mode="append")
    load(stack, other, mode="replace")
    assert rows(stack) == [{"id": 7, "w": "b"}]


def table_files(stack: StackConfig, table: str = "mine.events") -> set[Path]:
    """The data files and manifests under the table's folder (not its metadata JSON)."""
    location = open_catalog(stack.catalog).load_table(table).location().removeprefix("file://")
    return {p for p in Path(location).rglob("*") if p.suffix in (".parquet", ".avro")}


def test_a_load_that_fails_half_way_leaves_the_table_as_it_was(
    stack: StackConfig, tmp_path: Path
) -> None:
    good = tmp_path / "good.csv"
    good.write_text("n,ts\n0,2024-05-01 12:00:00\n")
    load(stack, good)
    before = table_files(stack)
    bad = tmp_path / "bad.csv"
    lines = [f"{n},2024-05-01 12:00:00\n" for n in range(10_000)]
    lines[9_000] = "9000,yesterday\n"
    bad.write_text("n,ts\n" + "".join(lines))
    opened = load_file(
        stack,
        bad,
        LoadOptions(
            "mine.events",
            mode="replace",
            timestamp_columns=("ts",),
            block_bytes=16 * 1024,
            file_rows=1_000,
        ),
    )
    try:
        with pytest.raises(LoadError, match=r"row 9,001: 'yesterday'"):
            opened.write()
    finally:
        opened.close()
    assert rows(stack) == [{"n": 0, "ts": NOON_UTC}]
    # Nine files of 1,000 rows were written before the bad row: none of them is left.
    assert table_files(stack) == before


def test_a_failed_append_deletes_the_files_it_wrote(stack: StackConfig, tmp_path: Path) -> None:
    good = tmp_path / "good.csv"
    good.write_text("code\n1\n")
    load(stack, good)
    before = table_files(stack)
    drift = tmp_path / "drift.csv"
    drift.write_text("code\n" + "2\n" * 20_000 + "A7\n")  # not a long, after some files
    with pytest.raises(LoadError, match=r"--type NAME=string"):
        load(stack, drift, mode="append", block_bytes=16 * 1024, file_rows=1_000)
    assert table_files(stack) == before
    assert rows(stack) == [{"code": 1}]


def test_a_later_block_that_breaks_the_inferred_type_says_to_declare_it(
    stack: StackConfig, tmp_path: Path
) -> None:
    path = tmp_path / "drift.csv"
    path.write_text("code\n" + "1\n" * 20_000 + "A7\n")
    with pytest.raises(LoadError, match=r"--type NAME=string"):
        load(stack, path, block_bytes=16 * 1024)
    load(stack, path, types={"code": "string"}, block_bytes=16 * 1024)
    assert len(rows(stack)) == 20_001


def test_an_append_adds_new_columns_only_when_told_and_a_failed_one_adds_none(
    stack: StackConfig, tmp_path: Path
) -> None:
    first = tmp_path / "a.csv"
    first.write_text("id\n1\n")
    load(stack, first)
    wider = tmp_path / "b.csv"
    wider.write_text("id,extra\n2,x\n")
    with pytest.raises(LoadError, match=r"no column.s. extra \(--add-columns adds them"):
        load(stack, wider, mode="append")
    bad = tmp_path / "c.csv"
    bad.write_text("id,n\n" + "3,1\n" * 20_000 + "4,A7\n")
    with pytest.raises(LoadError, match=r"--type NAME=string"):
        load(stack, bad, mode="append", add_columns=True, block_bytes=16 * 1024, file_rows=1_000)
    schema = open_catalog(stack.catalog).load_table("mine.events").schema()
    assert [f.name for f in schema.fields] == ["id"]  # the failed load added no column
    load(stack, wider, mode="append", add_columns=True)
    assert rows(stack) == [{"id": 1, "extra": None}, {"id": 2, "extra": "x"}]
    with pytest.raises(ConfigError, match=r"--add-columns .* with --append"):
        LoadOptions("mine.events", add_columns=True)


@pytest.mark.parametrize("name", ["short.csv", "short.csv.gz"])
def test_a_line_with_too_few_fields_is_named_by_its_line_number(
    stack: StackConfig, tmp_path: Path, name: str
) -> None:
    path = tmp_path / name
    # Blocks of 16 KiB: the short line is in a later block than the first.
    text = "a,b,c\n" + "1,2,3\n" * 20_000 + "7,8\n" + "4,5,6\n"
    if name.endswith(".gz"):
        with gzip.open(path, "wt") as out:
            out.write(text)
    else:
        path.write_text(text)
    with pytest.raises(LoadError, match=r"line 20,002: Expected 3 columns, got 2 \('7,8'\)"):
        load(stack, path, block_bytes=16 * 1024)
    assert not open_catalog(stack.catalog).table_exists("mine.events")


def test_ids_wider_than_a_long_are_kept_exact_as_text_with_a_note(
    stack: StackConfig, tmp_path: Path
) -> None:
    path = tmp_path / "ids.csv"
    ids = [18446744073709551615, 12345678901234567891, 7]
    path.write_text("id,n\n" + "".join(f"{i},{k}\n" for k, i in enumerate(ids)))
    opened = load_file(stack, path, LoadOptions("mine.events"))
    try:
        (column,) = [c for c in opened.plan.columns if c.name == "id"]
        assert (column.table_type, column.field_type) == ("string", "string")
        assert "--type id=double" in column.note
        opened.write()
    finally:
        opened.close()
    assert sorted(str(r["id"]) for r in rows(stack)) == sorted(str(i) for i in ids)
    # A column of true decimals stays a double.
    decimals = tmp_path / "decimals.csv"
    decimals.write_text("x\n1.5\n2\n")
    load(stack, decimals, table="mine.decimals")
    assert [r["x"] for r in rows(stack, "mine.decimals")] == [1.5, 2.0]
