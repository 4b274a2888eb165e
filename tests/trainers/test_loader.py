"""The trainer's loader: shuffling on the device gives the host shuffle's batches and cursors.

Run on CPU ("device" is then the CPU, but the path is the GPU's: windows packed in order, then
each batch gathered by index_select with the window's permutation), on real shard files.
"""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flow.errors import ShardCorruptError
from flow.handoff import Channel, ChannelReader, Commit, MixedReader, ReadOptions, World
from tests.support import Writer
from trainers import data as data_module
from trainers import loader as loader_module
from trainers.data import NO_TIME
from trainers.loader import Batch, DeviceLoader, ShuffleOn

CPU = torch.device("cpu")
COLUMNS = ["id", "x"]


def _reader(root: Path, name: str, options: ReadOptions, world: World | None = None) -> Any:
    return ChannelReader(str(root), name, world=world or World(), options=options)


def _batches(loader: DeviceLoader, limit: int | None = None) -> list[Batch]:
    out = []
    for batch in loader:
        out.append(batch)
        if limit is not None and len(out) >= limit:
            break
    return out


def _same(host: list[Batch], device: list[Batch]) -> None:
    assert len(host) == len(device)
    for h, d in zip(host, device, strict=True):
        assert h.cursor == d.cursor
        assert h.rows == d.rows
        for key in COLUMNS:
            assert torch.equal(h.tensors[key], d.tensors[key]), key


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    commits=st.lists(st.lists(st.integers(0, 300), min_size=1, max_size=6), min_size=1, max_size=3),
    batch=st.integers(2, 64),
    windows=st.integers(2, 5),
    world_size=st.sampled_from([1, 2]),
    shuffle=st.booleans(),
    ahead=st.sampled_from([0, 3]),
    seed=st.integers(0, 3),
)
def test_device_shuffle_gives_the_host_shuffles_batches_and_cursors(
    tmp_path_factory: pytest.TempPathFactory,
    commits: list[list[int]],
    batch: int,
    windows: int,
    world_size: int,
    shuffle: bool,
    ahead: int,
    seed: int,
) -> None:
    root = tmp_path_factory.mktemp("ch")
    w = Writer(root, "c", buckets=4)
    for sizes in commits:
        w.commit(sizes)
    options = ReadOptions(
        batch_size=batch, window_rows=batch * windows + 1, shuffle=shuffle, seed=seed
    )
    seen: list[int] = []
    for rank in range(world_size):
        world = World(rank, world_size)
        host = _batches(DeviceLoader(_reader(root, "c", options, world), CPU, COLUMNS))
        device = _batches(
            DeviceLoader(
                _reader(root, "c", options, world),
                CPU,
                COLUMNS,
                shuffle_on="device",
                ahead=ahead,
            )
        )
        _same(host, device)
        seen += [int(i) for b in device for i in b.tensors["id"]]
        for b in device:  # rows arrive whole: x repeats the id
            assert torch.equal(b.tensors["x"], b.tensors["id"].float().unsqueeze(1).expand(-1, 3))
    # No row twice over the ranks. (Which rows a finite epoch delivers at all is the reader's
    # rule, tested with the reader: with fewer rows than ranks, a rank may get none.)
    assert len(seen) == len(set(seen))


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(stop=st.integers(1, 40), ahead=st.sampled_from([0, 2]))
def test_a_device_shuffled_run_resumes_to_the_row(
    tmp_path_factory: pytest.TempPathFactory, stop: int, ahead: int
) -> None:
    root = tmp_path_factory.mktemp("ch")
    w = Writer(root, "c", buckets=4)
    w.commit([130, 70, 0, 211])
    w.commit([33, 340, 5, 90])
    options = ReadOptions(batch_size=24, window_rows=100, seed=5)
    full = _batches(DeviceLoader(_reader(root, "c", options), CPU, COLUMNS, shuffle_on="device"))
    stop = min(stop, len(full))
    first = _batches(
        DeviceLoader(_reader(root, "c", options), CPU, COLUMNS, shuffle_on="device", ahead=ahead),
        limit=stop,
    )
    resumed_reader = _reader(root, "c", options)
    resumed_reader.load_state_dict(first[-1].cursor)
    rest = _batches(DeviceLoader(resumed_reader, CPU, COLUMNS, shuffle_on="device", ahead=ahead))
    _same(full, first + rest)


def test_mixed_channels_shuffle_on_the_device_as_on_the_host(tmp_path: Path) -> None:
    for name in ("a", "b"):
        w = Writer(tmp_path, name, buckets=2)
        w.commit([90, 150])
        w.commit([64, 7])
    options = ReadOptions(batch_size=16, window_rows=50, seed=2)

    def mix() -> MixedReader:
        readers = {n: _reader(tmp_path, n, options) for n in ("a", "b")}
        return MixedReader(readers, weights={"a": 1.0, "b": 2.0}, seed=3)

    host = _batches(DeviceLoader(mix(), CPU, COLUMNS))
    device = _batches(DeviceLoader(mix(), CPU, COLUMNS, shuffle_on="device", ahead=2))
    _same(host, device)
    assert [b.channel for b in host] == [b.channel for b in device]
    assert {b.channel for b in host} == {"a", "b"}


def _loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "handoff-loader"]


def test_the_loaders_thread_ends_with_the_loop_and_hands_on_errors(tmp_path: Path) -> None:
    w = Writer(tmp_path, "c", buckets=2)
    w.commit([500, 500])
    options = ReadOptions(batch_size=10, window_rows=40)
    loader = DeviceLoader(_reader(tmp_path, "c", options), CPU, COLUMNS, ahead=3)
    assert len(_batches(loader, limit=2)) == 2
    assert not _loader_threads()  # the loop left early: the thread was stopped and joined

    w.commit([300, 300])
    shard = next((tmp_path / "c").rglob("*t1*"))
    shard.write_bytes(b"not an arrow file" * 100)
    reader = _reader(tmp_path, "c", ReadOptions(batch_size=10, window_rows=40, verify=False))
    with pytest.raises(ShardCorruptError):
        _batches(DeviceLoader(reader, CPU, COLUMNS, shuffle_on="device", ahead=2))
    assert not _loader_threads()


def test_an_unknown_shuffle_place_is_refused(tmp_path: Path) -> None:
    Writer(tmp_path, "c").commit([10])
    with pytest.raises(Exception, match="shuffle_on='gpu'"):
        DeviceLoader(_reader(tmp_path, "c", ReadOptions(batch_size=4)), CPU, COLUMNS,
                     shuffle_on="gpu")  # type: ignore[arg-type]  # fmt: skip


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_threaded_copy_and_device_gather_give_the_host_batches(tmp_path: Path) -> None:
    """The GPU path proper: a loader thread, a side stream, events, index_select on the GPU."""
    w = Writer(tmp_path, "c", buckets=4)
    for _ in range(3):
        w.commit([4000, 2500, 3100, 777])
    options = ReadOptions(batch_size=512, window_rows=4096, seed=11, threads=3)
    cuda = torch.device("cuda")
    host = _batches(DeviceLoader(_reader(tmp_path, "c", options), CPU, COLUMNS))
    for shuffle_on in ("host", "device"):
        loader = DeviceLoader(
            _reader(tmp_path, "c", options), cuda, COLUMNS, shuffle_on=shuffle_on, ahead=4
        )
        batches = []
        for batch in loader:  # as a training step would: use the batch on the compute stream
            doubled = {k: v * 2 for k, v in batch.tensors.items()}
            batches.append(Batch({k: v.cpu() // 2 for k, v in doubled.items()}, batch.cursor,
                                 batch.rows, batch.wait_s))  # fmt: skip
        _same(host, batches)


def _side_channel(root: Path, name: str, first_id: int, weighted: bool) -> None:
    """Rows numbered from ``first_id`` with the columns read for metrics only: an event time
    of ``id`` seconds, a production time and an oracle value that are null on every third row
    (backfill rows have no production time), and a ``weight`` of ``id`` where ``weighted``."""
    fields = [
        ("id", pa.int64()),
        ("x", pa.list_(pa.float32(), 3)),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("produced_at", pa.timestamp("ms", tz="UTC")),
        ("p_click", pa.float32()),
    ] + ([("weight", pa.float32())] if weighted else [])
    schema = pa.schema(fields)
    channel = Channel(str(root), name)
    meta = channel.create(schema, num_buckets=2)
    for batch_id in range(2):
        shards = []
        for bucket in range(2):
            ids = first_id + np.arange(
                bucket * 1000 + batch_id * 100, bucket * 1000 + batch_id * 100 + 90
            )
            null = ids % 3 == 0
            columns = [
                pa.array(ids),
                pa.FixedSizeListArray.from_arrays(
                    pa.array(np.repeat(ids, 3).astype(np.float32)), 3
                ),
                pa.array(ids * 1_000_000, pa.timestamp("us", tz="UTC")),
                pa.array(ids * 1000, pa.timestamp("ms", tz="UTC"), mask=null),
                pa.array((ids % 1000) / 1000, pa.float32(), mask=null),
            ] + ([pa.array(ids.astype(np.float32))] if weighted else [])
            table = pa.table(columns, schema=schema)
            shards.append(channel.write_bucket(batch_id, bucket, table, f"t{bucket}"))
        channel.add_commit(Commit(name, batch_id, tuple(shards), meta.fingerprint))


@pytest.mark.parametrize(("shuffle_on", "ahead"), [("host", 0), ("device", 0), ("device", 2)])
def test_a_batch_comes_from_one_channel_with_its_metrics_columns_row_by_row(
    tmp_path: Path, shuffle_on: ShuffleOn, ahead: int
) -> None:
    _side_channel(tmp_path, "a", 0, weighted=False)
    _side_channel(tmp_path, "b", 100_000, weighted=True)
    options = ReadOptions(batch_size=16, window_rows=64, seed=4)
    readers = {n: _reader(tmp_path, n, options) for n in ("a", "b")}
    loader = DeviceLoader(
        MixedReader(readers, weights={"a": 1.0, "b": 1.0}, seed=1),
        CPU,
        COLUMNS,
        optional=["weight"],
        event_time="ts",
        produced_time="produced_at",
        oracle="p_click",
        shuffle_on=shuffle_on,
        ahead=ahead,
    )
    batches = _batches(loader)
    assert {b.channel for b in batches} == {"a", "b"}
    for b in batches:
        ids = b.tensors["id"].numpy()
        # One channel per batch: channel a numbers its rows below 100,000, b from there.
        assert np.all(ids < 100_000) if b.channel == "a" else np.all(ids >= 100_000)
        assert ("weight" in b.tensors) == (b.channel == "b")
        if b.channel == "b":
            assert np.array_equal(b.tensors["weight"].numpy(), ids.astype(np.float32))
        null = ids % 3 == 0
        assert b.event_time_us is not None
        assert b.produced_us is not None
        assert b.oracle is not None
        assert np.array_equal(b.event_time_us, ids * 1_000_000)
        assert np.all(b.produced_us[null] == NO_TIME)
        assert np.array_equal(b.produced_us[~null], ids[~null] * 1_000_000)  # ms read as us
        assert np.all(np.isnan(b.oracle[null]))
        assert np.allclose(b.oracle[~null], (ids[~null] % 1000) / 1000)
        assert b.epoch == 0


def test_batches_carry_the_readers_epoch(tmp_path: Path) -> None:
    Writer(tmp_path, "c", buckets=2).commit([40, 40])
    reader = _reader(tmp_path, "c", ReadOptions(batch_size=16, window_rows=32))
    epochs = [b.epoch for _ in range(2) for b in DeviceLoader(reader, CPU, COLUMNS)]
    assert epochs == [0] * 5 + [1] * 5


def test_mixed_channels_copy_each_window_to_the_device_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("a", "b"):
        Writer(tmp_path, name, buckets=2).commit([500, 500])
    packed: list[int] = []
    pack = data_module.pack_columns

    def counted(*args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        packed.append(1)
        return pack(*args, **kwargs)

    monkeypatch.setattr(loader_module, "pack_columns", counted)
    options = ReadOptions(batch_size=16, window_rows=256, seed=2)
    readers = {n: _reader(tmp_path, n, options) for n in ("a", "b")}
    mix = MixedReader(readers, weights={"a": 1.0, "b": 1.0}, seed=3)
    batches = _batches(DeviceLoader(mix, CPU, COLUMNS, shuffle_on="device"))
    switches = sum(a.channel != b.channel for a, b in itertools.pairwise(batches))
    assert switches > 20  # the channels alternate ...
    assert len(packed) == 8  # ... yet each of the 2 x 4 windows is copied once
