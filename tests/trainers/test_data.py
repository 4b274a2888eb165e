"""Handoff batches become tensors without copying the feature blocks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from flow.errors import ConfigError
from flow.handoff import Channel, ChannelReader, Commit, ReadOptions
from trainers.data import (
    NO_KEY,
    NO_TIME,
    HandoffDataset,
    key_hashes,
    probabilities,
    timestamps_us,
    to_tensors,
)

SCHEMA = pa.schema(
    [
        ("label", pa.float32()),
        ("dense", pa.list_(pa.float32(), 13)),
        ("sparse", pa.list_(pa.int64(), 26)),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("name", pa.string()),
    ]
)


def table(rows: int, start: int = 0) -> pa.Table:
    ids = np.arange(start, start + rows)
    return pa.table(
        {
            "label": (ids % 2).astype(np.float32),
            "dense": pa.FixedSizeListArray.from_arrays(
                pa.array(np.repeat(ids, 13).astype(np.float32)), 13
            ),
            "sparse": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 26)), 26),
            "ts": pa.array(ids * 1_000_000, pa.timestamp("us", tz="UTC")),
            "name": [f"r{i}" for i in ids],
        },
        schema=SCHEMA,
    )


def test_feature_blocks_are_views_of_the_arrow_buffers() -> None:
    batch = table(100).to_batches()[0].slice(10, 50)
    tensors = to_tensors(batch)
    assert set(tensors) == {"label", "dense", "sparse", "ts"}  # strings have no tensor form
    assert tensors["dense"].shape == (50, 13)
    assert tensors["sparse"].dtype == torch.int64
    assert tensors["sparse"][0, 0].item() == 10
    values = batch.column("sparse").flatten()
    assert tensors["sparse"].data_ptr() == values.buffers()[1].address + values.offset * 8
    with pytest.raises(TypeError, match=r"'name' .* has nulls or no tensor form"):
        to_tensors(batch, ["name"])


def test_a_dataloader_over_a_channel_yields_every_row_once(tmp_path: Path) -> None:
    channel = Channel(str(tmp_path), "c")
    channel.create(SCHEMA, num_buckets=2)
    shards = tuple(channel.write_bucket(0, b, table(500, start=b * 500), f"t{b}") for b in range(2))
    channel.add_commit(Commit("c", 0, shards, channel.meta().fingerprint))
    reader = ChannelReader(str(tmp_path), "c", options=ReadOptions(batch_size=64, seed=1))
    dataset = HandoffDataset(reader, columns=["label", "dense", "sparse"])
    seen = [int(x) for b in DataLoader(dataset, batch_size=None) for x in b["sparse"][:, 0]]
    assert sorted(seen) == list(range(1000))
    assert dataset.state_dict()["epoch"] == 1


def test_dataloader_workers_are_refused_rather_than_reading_every_row_again(
    tmp_path: Path,
) -> None:
    channel = Channel(str(tmp_path), "c")
    channel.create(SCHEMA, num_buckets=2)
    shards = tuple(channel.write_bucket(0, b, table(100, start=b * 100), f"t{b}") for b in range(2))
    channel.add_commit(Commit("c", 0, shards, channel.meta().fingerprint))
    reader = ChannelReader(str(tmp_path), "c", options=ReadOptions(batch_size=16))
    loader = DataLoader(HandoffDataset(reader), batch_size=None, num_workers=1)
    with pytest.raises(ConfigError, match=r"num_workers=0.*ReadOptions\(threads=N\)"):
        next(iter(loader))


def test_metrics_only_columns_keep_their_nulls_as_markers() -> None:
    stamps = pa.array([1_000, None, 3_000], pa.timestamp("ms", tz="UTC"))
    assert timestamps_us(stamps, "produced_at").tolist() == [1_000_000, NO_TIME, 3_000_000]
    found = probabilities(pa.array([0.25, None, 1.0], pa.float32()), "p_click")
    assert np.array_equal(found, [0.25, np.nan, 1.0], equal_nan=True)
    with pytest.raises(ConfigError, match="'ts' is int64, not a timestamp"):
        timestamps_us(pa.array([1, 2]), "ts")
    with pytest.raises(ConfigError, match=r"'p_click': 1 of 2 values lie outside \[0, 1\]"):
        probabilities(pa.array([0.5, 1.5]), "p_click")
    with pytest.raises(ConfigError, match="--oracle 'p_click': the column is string"):
        probabilities(pa.array(["a"]), "p_click")


@settings(max_examples=60, deadline=None)
@given(
    keys=st.lists(st.one_of(st.none(), st.text(max_size=12)), min_size=1, max_size=40),
    cut=st.integers(0, 40),
)
def test_a_key_hashes_the_same_in_any_batch_and_distinct_keys_apart(
    keys: list[str | None], cut: int
) -> None:
    whole = key_hashes(pa.array(keys, pa.string()), "k")
    cut = min(cut, len(keys))
    # Sliced, chunked, large strings: the same hash for the same key.
    pieces = pa.chunked_array(
        [pa.array(keys[:cut], pa.string()), pa.array(keys[cut:], pa.string())]
    )
    assert (key_hashes(pieces, "k") == whole).all()
    assert (key_hashes(pa.array(keys, pa.large_string()), "k") == whole).all()
    assert (key_hashes(pa.array(keys, pa.string()).slice(cut), "k") == whole[cut:]).all()
    by_key: dict[str, int] = {}
    for key, hashed in zip(keys, whole.tolist(), strict=True):
        if key is None:
            assert hashed == NO_KEY
        else:
            assert hashed != NO_KEY
            assert by_key.setdefault(key, hashed) == hashed
    assert len(set(by_key.values())) == len(by_key)  # no two keys here collide


def test_integer_keys_hash_and_other_kinds_are_refused() -> None:
    hashed = key_hashes(pa.array([7, None, 7, 8], pa.int32()), "impression_id")
    assert hashed[0] == hashed[2] != hashed[3]
    assert hashed[1] == NO_KEY
    assert (key_hashes(pa.array([7, 8], pa.int64()), "k") == hashed[[0, 3]]).all()
    with pytest.raises(ConfigError, match=r"key column 'score' is double; a label key is a"):
        key_hashes(pa.array([0.5]), "score")
