"""flow.handoff.write_table: a channel from pandas or pyarrow, with the commits and checks of
Spark's writer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from flow.errors import HandoffError
from flow.handoff import Channel, ChannelReader, ReadOptions, World, write_table
from flow.handoff.format import SHARDS
from flow.handoff.write import DEAD_LETTER_SCHEMA, assign_buckets


def _frame(rows: int = 100, start: int = 0) -> pd.DataFrame:
    ids = np.arange(start, start + rows)
    return pd.DataFrame(
        {
            "id": ids,
            "user": [f"u{i % 7}" for i in ids],
            "label": ids % 2,
            "dense": [[float(i), 1.0] for i in ids],
            "time": pd.date_range("2026-01-01", periods=rows, freq="min"),
        }
    )


def _ids(root: Path, channel: str, world_size: int = 1) -> list[int]:
    seen: list[int] = []
    for rank in range(world_size):
        reader = ChannelReader(
            str(root), channel, world=World(rank, world_size), options=ReadOptions(batch_size=8)
        )
        seen += [i for b in reader for i in b.column("id").to_pylist()]
    return sorted(seen)


def test_a_dataframe_becomes_a_channel_every_reader_reads_whole(tmp_path: Path) -> None:
    done = write_table(
        tmp_path, "c", _frame(), batch_id=0, label="label", event_time="time", num_buckets=4
    )
    assert done.commit is not None
    assert done.rows == 100
    assert not done.replayed
    assert done.commit.stats == {"dead_letters": 0, "positives": 50}
    assert done.commit.event_time["min"] == "2026-01-01T00:00:00+00:00"
    assert done.commit.seq == 0
    assert done.commit.writer == "write_table"
    meta = Channel(str(tmp_path), "c").meta()
    assert meta.schema.field("dense").type == pa.list_(pa.float64(), 2)  # a feature block
    assert meta.schema.field("time").type == pa.timestamp("us", tz="UTC")  # as Spark writes
    assert done.commit.schema_fingerprint == meta.fingerprint
    assert _ids(tmp_path, "c") == list(range(100))
    assert _ids(tmp_path, "c", world_size=2) == list(range(100))
    assert Channel(str(tmp_path), "c").verify().ok


def test_a_pyarrow_table_and_shards_of_bounded_size(tmp_path: Path) -> None:
    table = pa.table({"id": np.arange(1000), "x": np.ones(1000)})
    done = write_table(tmp_path, "c", table, num_buckets=2, max_rows_per_shard=100)
    assert done.commit is not None
    assert max(s.rows for s in done.commit.shards) <= 100
    assert {s.bucket for s in done.commit.shards} == {0, 1}
    assert _ids(tmp_path, "c") == list(range(1000))


def test_buckets_round_robin_or_by_key_are_pure_functions() -> None:
    spread = assign_buckets(1001, 8, seed=3)
    counts = np.bincount(spread, minlength=8)
    assert counts.max() - counts.min() <= 1
    assert (spread == assign_buckets(1001, 8, seed=3)).all()
    assert not (spread == assign_buckets(1001, 8, seed=4)).all()
    keys = pa.array([f"k{i % 13}" for i in range(500)])
    by_key = assign_buckets(500, 8, seed=0, keys=keys)
    for key in range(13):
        assert len(set(by_key[np.arange(key, 500, 13)].tolist())) == 1
    nulls = assign_buckets(3, 8, seed=0, keys=pa.array([None, "a", None]))
    assert nulls[0] == nulls[2]


def test_a_key_keeps_its_bucket_from_batch_to_batch(tmp_path: Path) -> None:
    first = write_table(tmp_path, "c", _frame(70), shuffle_key="user", num_buckets=4)
    second = write_table(tmp_path, "c", _frame(70, start=70), shuffle_key="user")
    assert first.commit is not None
    assert second.commit is not None
    buckets: dict[str, int] = {}
    for commit in (first.commit, second.commit):
        for shard in commit.shards:
            table = pa.ipc.open_file(str(tmp_path / "c" / shard.path)).read_all()
            for user in table.column("user").to_pylist():
                assert buckets.setdefault(user, shard.bucket) == shard.bucket, user


def test_a_retry_of_a_batch_id_writes_nothing_and_other_rows_are_refused(tmp_path: Path) -> None:
    first = write_table(tmp_path, "c", _frame(), batch_id=5)
    shards = sorted(p.name for p in (tmp_path / "c" / SHARDS).rglob("*.arrow"))
    again = write_table(tmp_path, "c", _frame(), batch_id=5)
    assert again.replayed
    assert again.rows == 100
    assert again.batch_id == 5
    assert sorted(p.name for p in (tmp_path / "c" / SHARDS).rglob("*.arrow")) == shards
    with pytest.raises(HandoffError, match=r"already committed with 100 rows.*new batch_id"):
        write_table(tmp_path, "c", _frame(60), batch_id=5)
    nxt = write_table(tmp_path, "c", _frame(10, start=100))
    assert nxt.batch_id == 6
    assert nxt.commit is not None
    assert nxt.commit.previous == 5
    assert first.commit is not None
    with pytest.raises(HandoffError, match="comes too late"):
        write_table(tmp_path, "c", _frame(10, start=200), batch_id=2)
    assert _ids(tmp_path, "c") == list(range(110))


def test_shards_of_an_attempt_that_failed_before_committing_are_never_read(
    tmp_path: Path,
) -> None:
    write_table(tmp_path, "c", _frame(10), batch_id=0)
    Channel(str(tmp_path), "c").write_bucket(
        1, 0, pa.Table.from_pandas(_frame(10, start=50)), "dead"
    )
    write_table(tmp_path, "c", _frame(10, start=10), batch_id=1)
    assert _ids(tmp_path, "c") == list(range(20))
    assert Channel(str(tmp_path), "c").verify().ok


def test_a_channel_s_schema_buckets_and_writer_are_kept(tmp_path: Path) -> None:
    write_table(tmp_path, "c", _frame(), num_buckets=4)
    with pytest.raises(HandoffError, match=r"lacks label.*also has extra.*new channel"):
        write_table(tmp_path, "c", _frame().drop(columns="label").assign(extra=1))
    with pytest.raises(HandoffError, match=r"column 'id' is string.*holds int64"):
        write_table(tmp_path, "c", _frame().assign(id="x"))
    with pytest.raises(HandoffError, match="has 4 buckets, not 8"):
        write_table(tmp_path, "c", _frame(), num_buckets=8)
    with pytest.raises(HandoffError, match="written by write_table, not nightly"):
        write_table(tmp_path, "c", _frame(), writer="nightly")
    # Columns in another order and castable types are fine.
    reordered = _frame(10, start=100)[["label", "user", "id", "time", "dense"]]
    write_table(tmp_path, "c", reordered.assign(id=reordered["id"].astype("int32")))
    assert _ids(tmp_path, "c") == list(range(110))


def test_rows_that_cannot_train_are_refused_or_returned_and_counted(tmp_path: Path) -> None:
    frame = _frame(6).astype({"label": "float64"})
    frame.loc[1, "label"] = None
    frame.at[3, "sparse"] = None
    frame["sparse"] = [[0, 1], [1, 1], [0, 9], [1, 0], [0, 0], [1, -1]]
    layout = {"dense": ["a", "b"], "sparse": [["s", 2], ["t", 2]], "sequences": []}
    with pytest.raises(HandoffError, match=r"3 of 6 rows cannot train \(row 1: label is null"):
        write_table(tmp_path, "c", frame, label="label", layout=layout)
    assert not Channel(str(tmp_path), "c").exists()
    done = write_table(
        tmp_path, "c", frame, label="label", layout=layout, dead_letters="return", batch_id=0
    )
    letters = done.dead_letters
    assert letters.schema == DEAD_LETTER_SCHEMA
    assert letters.column("row").to_pylist() == [1, 2, 5]
    assert letters.column("reason").to_pylist() == [
        "label is null",
        "sparse[1] (t) = 9 is outside 0..1",
        "sparse[1] (t) = -1 is outside 0..1",
    ]
    assert done.commit is not None
    assert done.commit.stats["dead_letters"] == 3
    assert done.rows + letters.num_rows == len(frame)
    assert Channel(str(tmp_path), "c").meta().layout == layout
    assert _ids(tmp_path, "c") == [0, 3, 4]


def test_feature_blocks_of_the_wrong_length_or_with_nulls_are_dead_letters(
    tmp_path: Path,
) -> None:
    table = pa.table(
        {"id": [0, 1, 2, 3], "dense": [[1.0, 2.0], [1.0], None, [None, 2.0]]},
    )
    done = write_table(
        tmp_path, "c", table, fixed_sizes={"dense": 2}, dead_letters="return", num_buckets=1
    )
    assert done.dead_letters.column("reason").to_pylist() == [
        "dense has 1 values, not 2",
        "dense is null",
        "dense holds a null",
    ]
    assert _ids(tmp_path, "c") == [0]


def test_bad_arguments_say_what_to_change(tmp_path: Path) -> None:
    with pytest.raises(HandoffError, match="pyarrow Table or RecordBatch or a pandas DataFrame"):
        write_table(tmp_path, "c", [{"id": 1}])
    with pytest.raises(HandoffError, match="shuffle_key='nope' is not a column; columns: id"):
        write_table(tmp_path, "c", _frame(), shuffle_key="nope")
    with pytest.raises(HandoffError, match="event_time='user' is string, not a timestamp"):
        write_table(tmp_path, "c", _frame(), event_time="user")
    with pytest.raises(HandoffError, match="num_buckets=0"):
        write_table(tmp_path, "c", _frame(), num_buckets=0)
    with pytest.raises(HandoffError, match=r"feature block 'dense2'.*is not a column"):
        write_table(tmp_path, "c", _frame(), fixed_sizes={"dense2": 2})
    with pytest.raises(HandoffError, match="compression 'snappy' is unknown"):
        write_table(tmp_path, "c", _frame(), compression="snappy")
    assert not Channel(str(tmp_path), "c").exists()


def test_a_closed_write_ends_a_follower(tmp_path: Path) -> None:
    write_table(tmp_path, "c", _frame(20), close=True)
    reader = ChannelReader(
        str(tmp_path), "c", world=World(0, 1), options=ReadOptions(batch_size=8, follow=True)
    )
    assert sum(b.num_rows for b in reader) == 20


def test_nulls_in_a_column_the_channel_holds_without_nulls_are_dead_letters(
    tmp_path: Path,
) -> None:
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    Channel(str(tmp_path), "c").create(schema, num_buckets=1)  # as Spark makes a non-null column
    with pytest.raises(HandoffError, match=r"row 1: id is null"):
        write_table(tmp_path, "c", pa.table({"id": [1, None]}))
    done = write_table(tmp_path, "c", pa.table({"id": [1, None]}), dead_letters="return")
    assert done.rows == 1
    assert done.dead_letters.num_rows == 1
