"""The trainer's row-level audit: written at each checkpoint, so a run that dies mid-way leaves
the reads its checkpoints count, and with its resumption proves every row read exactly once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from flow.handoff import Channel
from flow.handoff.audit import key_row_ids, prove_channel, read_audit, row_ids
from flow.training import ModelConfig
from tests.trainers.channels import write_delayed
from tests.trainers.test_train import config
from trainers.data import key_hashes
from trainers.session import Session
from trainers.train import train

ROWS = 3_000
"""Rows of the channel: 24 steps of 128 (the last one short)."""


class KilledError(Exception):
    """Stands in for SIGKILL: nothing after it runs, no audit part or checkpoint more."""


def test_the_trainer_names_rows_as_the_verifier_does() -> None:
    keys = pa.array(["3-1", "3-2", None, "3-1"])
    labels = np.array([0.0, 1.0, 0.0, 1.0])
    trained = key_row_ids(key_hashes(keys, "impression_id"), labels)
    kept = [0, 1, 3]
    assert trained[kept].tolist() == row_ids(keys.take(kept), pa.array(labels[kept])).tolist()


def keyed(tmp_path: Path, **changes: Any) -> Any:
    return config(
        tmp_path,
        model=ModelConfig("dlrm", embedding_dim=4, hidden=(8,), bottom=(8,)),
        **changes,
    )


def test_a_run_killed_mid_way_and_resumed_reads_every_row_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_delayed(tmp_path, "train", "window", ROWS, seed=3, oracle=False)
    audit, checkpoints = tmp_path / "audit", tmp_path / "checkpoints"
    step = Session._step

    def dies_at_step_18(self: Session, *args: Any) -> Any:
        if self.step == 17:
            raise KilledError
        return step(self, *args)

    monkeypatch.setattr(Session, "_step", dies_at_step_18)
    with pytest.raises(KilledError):
        train(keyed(tmp_path, audit_dir=audit, checkpoint_dir=checkpoints), say=lambda _: None)
    # What the dead run leaves proves its reads: the rows of its 15 checkpointed steps, once.
    channel = Channel(str(tmp_path), "train")
    partial = prove_channel(channel, audit)
    assert partial.read == 15 * 128
    assert not partial.duplicates
    assert sum(partial.gaps.values()) == ROWS - 15 * 128
    monkeypatch.setattr(Session, "_step", step)
    result = train(keyed(tmp_path, audit_dir=audit, checkpoint_dir=checkpoints), say=print)
    assert result.resumed_from == 15
    proof = prove_channel(channel, audit)
    assert proof.exactly_once, proof.lines()
    assert proof.read == ROWS


def test_a_run_started_again_from_scratch_is_proved_to_read_rows_twice(tmp_path: Path) -> None:
    write_delayed(tmp_path, "train", "window", ROWS, seed=3, oracle=False)
    audit = tmp_path / "audit"
    train(keyed(tmp_path, audit_dir=audit, max_steps=10), say=lambda _: None)
    train(keyed(tmp_path, audit_dir=audit, fresh=True), say=lambda _: None)
    proof = prove_channel(Channel(str(tmp_path), "train"), audit)
    assert len(proof.duplicates) == 10 * 128
    assert not proof.gaps
    assert read_audit(audit).num_rows == ROWS + 10 * 128
