"""A trainer run on raw ids: a channel with an ``ids`` block, a dynamic table, exact resume."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from flow.handoff import Channel, Commit
from flow.pipeline.state import Layout
from flow.training import EmbeddingConfig, ModelConfig, OptimConfig, TrainConfig, save_config
from tests.support import REPO
from trainers.checkpoint import Checkpointer
from trainers.train import train

LAYOUT = Layout(dense=("price",), sparse=(("country", 8),), sequences=(), ids=("item_id",))
SCHEMA = pa.schema(
    [
        pa.field("label", pa.float32(), False),
        pa.field("dense", pa.list_(pa.float32(), 1), False),
        pa.field("sparse", pa.list_(pa.int64(), 1), False),
        pa.field("ids", pa.list_(pa.int64(), 1), False),
    ]
)


def _rows(n: int, seed: int) -> pa.Table:
    """Raw 64-bit item ids (some far beyond any table), clicked when the item is 'good'."""
    rng = np.random.default_rng(seed)
    item = rng.integers(0, 300, n)
    raw = item * 1_000_003 * 7919 + 2**40
    price = rng.normal(0, 1, n).astype(np.float32)
    logit = np.where(item % 3 == 0, 1.5, -1.5) - price
    label = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)

    def block(values: np.ndarray, kind: pa.DataType) -> pa.Array:
        return pa.FixedSizeListArray.from_arrays(pa.array(values, kind), 1)

    return pa.table(
        [
            pa.array(label),
            block(price, pa.float32()),
            block(rng.integers(0, 8, n), pa.int64()),
            block(raw.astype(np.int64), pa.int64()),
        ],
        schema=SCHEMA,
    )


def _write(root: Path, commits: list[int]) -> None:
    channel = Channel(str(root), "train")
    meta = channel.create(SCHEMA, num_buckets=2, layout=LAYOUT.to_dict())
    for batch_id, count in enumerate(commits):
        table = _rows(count, batch_id)
        half = count // 2
        shards = tuple(
            channel.write_bucket(batch_id, b, table.slice(b * half, half), f"t{b}") for b in (0, 1)
        )
        channel.add_commit(Commit("train", batch_id, shards, meta.fingerprint))


def _config(root: Path, checkpoints: Path, **changes: object) -> TrainConfig:
    table = EmbeddingConfig("item_id", rows=128, min_count=2, ttl=20)  # 300 items, 127 rows
    given: dict[str, object] = {
        "handoff": str(root),
        "channels": ("train",),
        "model": ModelConfig("deepfm", embedding_dim=8, hidden=(16,), embeddings=(table,)),
        "optim": OptimConfig(lr=0.01),
        "batch_size": 128,
        "window_batches": 2,
        "device": "cpu",
        "tracking": False,
        "log_every": 10_000,
        "checkpoint_dir": str(checkpoints),
        "checkpoint_every": 5,
    }
    return TrainConfig(**(given | changes))  # type: ignore[arg-type]


def _final_model(folder: Path) -> dict[str, torch.Tensor]:
    loaded = Checkpointer(str(folder), 0, 1).load()
    assert loaded is not None
    state, _ = loaded
    model: dict[str, torch.Tensor] = state["model"]
    return model


def test_a_run_on_raw_ids_learns_and_resumes_exactly(tmp_path: Path) -> None:
    _write(tmp_path, [2048, 2048])
    whole = _config(tmp_path, tmp_path / "whole")
    result = train(whole, say=lambda _: None)
    assert result.rows == 4096
    expected = _final_model(tmp_path / "whole")
    keys = expected["id_tables.tables.item_id.keys"]
    assert 0 < int((keys != 2**63 - 1).sum()) <= 127

    # Killed after step 17, restarted from its checkpoint of step 15.
    checkpoints = tmp_path / "resumed"
    train(_config(tmp_path, checkpoints, max_steps=17), say=lambda _: None)
    (checkpoints / "latest").write_text("15")
    resumed = train(_config(tmp_path, checkpoints), say=lambda _: None)
    assert resumed.resumed_from == 15
    got = _final_model(checkpoints)
    for name, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, got[name]), name


def test_the_exported_model_takes_raw_ids_in_a_column_per_id_feature() -> None:
    from trainers.export import batch_from_frame, example_frame
    from trainers.models import build_model

    config = ModelConfig(
        "deepfm", embedding_dim=4, hidden=(8,), embeddings=(EmbeddingConfig("item_id", rows=8),)
    )
    model = build_model(config, LAYOUT)
    frame = example_frame(LAYOUT)
    assert "item_id" in frame.columns
    frame["item_id"] = [2**62 + 3, 5]
    batch = batch_from_frame(frame, LAYOUT)
    assert batch["ids"].tolist() == [[2**62 + 3], [5]]
    model.train()
    model(batch)  # admits both ids
    model.eval()
    with torch.no_grad():
        scored = model(batch_from_frame(frame, LAYOUT))
    assert scored.shape == (2,)
    assert model.id_tables is not None
    assert (model.id_tables(batch, update=False) > 0).all()  # both have rows of their own


@pytest.mark.slow
def test_two_ranks_under_torchrun_train_a_dynamic_table(tmp_path: Path) -> None:
    _write(tmp_path, [1024, 1024])
    run = _config(tmp_path, tmp_path / "ckpt", batch_size=64)
    config_file = save_config(run, tmp_path / "run.json")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
        "-m", "trainers", "train", "--config", str(config_file), "--no-tracking",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FLOW_HOME": str(tmp_path / "home")}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    model = _final_model(tmp_path / "ckpt")
    keys = model["id_tables.tables.item_id.keys"]
    assert 0 < int((keys != 2**63 - 1).sum()) <= 127
