"""A row-level audit: row ids from a key and a label, written part by part, read back in order,
and proved against a channel's rows (read exactly once, or the duplicates and gaps by id)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner

from flow.cli import main
from flow.errors import ConfigError
from flow.handoff import Channel, Commit
from flow.handoff.audit import (
    AuditWriter,
    channel_row_ids,
    prove,
    prove_channel,
    read_audit,
    row_ids,
)

SCHEMA = pa.schema([("impression_id", pa.string()), ("label", pa.float32())])


def keyed_channel(root: Path, ids: list[str], labels: list[float], commits: int = 2) -> Channel:
    """A channel of ``ids`` (its label key) and labels, over ``commits`` commits."""
    channel = Channel(str(root), "live")
    meta = channel.create(SCHEMA, num_buckets=1, labels={"key": "impression_id"})
    table = pa.table({"impression_id": ids, "label": pa.array(labels, pa.float32())}, SCHEMA)
    per = -(-len(ids) // commits)
    for batch_id in range(commits):
        part = table.slice(batch_id * per, per)
        shard = channel.write_bucket(batch_id, 0, part, "t0")
        channel.add_commit(Commit("live", batch_id, (shard,), meta.fingerprint))
    return channel


def test_a_row_id_is_its_key_and_label_the_same_in_any_batch() -> None:
    ids = row_ids(pa.array(["a", "b", "a"]), pa.array([0.0, 0.0, 1.0]))
    again = row_ids(pa.chunked_array([["b"], ["a"]]), pa.array([0.0, 1.0]))
    assert ids.dtype == np.uint64
    assert len(set(ids.tolist())) == 3  # an impression's negative and positive: two rows
    assert again.tolist() == [ids[1], ids[2]]
    numbers = row_ids(pa.array([7, 8, 7], pa.int64()), pa.array([0.0, 0.0, 0.0]))
    assert numbers[0] == numbers[2] != numbers[1]  # integer keys too
    with pytest.raises(ConfigError, match="have no key"):
        row_ids(pa.array(["a", None]), pa.array([0.0, 0.0]))


def test_parts_are_written_as_the_run_goes_and_read_back_in_order(tmp_path: Path) -> None:
    audit = AuditWriter(tmp_path, rank=0)
    audit.add(np.array([1, 2], np.uint64), "live")
    assert audit.flush(step=5) is not None
    assert read_audit(tmp_path).column("row_id").to_pylist() == [1, 2]  # before the run ends
    audit.add(np.array([3], np.uint64), "backfill")
    audit.add(np.array([4], np.uint64), "live")
    audit.flush(step=10)
    assert audit.flush(step=10) is None  # nothing new: no part
    found = read_audit(tmp_path, rank=0)
    assert found.column("row_id").to_pylist() == [1, 2, 3, 4]
    assert found.column("channel").cast(pa.string()).to_pylist() == [
        "live",
        "live",
        "backfill",
        "live",
    ]
    assert not list(tmp_path.glob("*.tmp"))
    # A resumed run's parts come after the run before it.
    later = AuditWriter(tmp_path, rank=0, resumed_from=10)
    later.add(np.array([5], np.uint64), "live")
    later.flush(step=15)
    assert read_audit(tmp_path, 0).column("row_id").to_pylist() == [1, 2, 3, 4, 5]
    assert read_audit(tmp_path, 1).num_rows == 0


def test_the_steps_a_resumed_run_reads_again_are_left_out_of_the_run_before(
    tmp_path: Path,
) -> None:
    """A run wrote its part of step 10, then died before its checkpoint of step 10: the next
    run resumes from step 5 and reads steps 6-10 again; their training was lost with the first
    run, and the audit counts the reads once."""
    died = AuditWriter(tmp_path, rank=0)
    for step, ids in ((5, [1, 2]), (10, [3, 4])):
        died.add(np.array(ids, np.uint64), "live")
        died.flush(step)
    resumed = AuditWriter(tmp_path, rank=0, resumed_from=5)
    resumed.add(np.array([3, 4, 5], np.uint64), "live")
    resumed.flush(15)
    assert read_audit(tmp_path).column("row_id").to_pylist() == [1, 2, 3, 4, 5]
    # A run started from nothing supersedes nothing: its reads are reads again.
    again = AuditWriter(tmp_path, rank=0)
    again.add(np.array([1], np.uint64), "live")
    again.flush(1)
    assert read_audit(tmp_path).column("row_id").to_pylist() == [1, 2, 3, 4, 5, 1]


def test_every_row_once_is_proved_and_a_duplicate_and_a_gap_are_named(tmp_path: Path) -> None:
    channel = keyed_channel(tmp_path, ["a", "b", "c", "a"], [0.0, 0.0, 0.0, 1.0])
    held = channel_row_ids(channel, "impression_id")
    assert len(held) == 4
    reads = [held[[2, 0]], held[[3, 1]]]  # two ranks, any order
    proof = prove(reads, held)
    assert proof.exactly_once
    assert proof.lines() == ["audit: each of 4 rows read exactly once"]
    b, c = held[1], held[2]
    broken = prove([held[[0, 1, 1, 3]]], held)  # b twice, c never
    assert not broken.exactly_once
    assert broken.duplicates == {int(b): 2}
    assert broken.gaps == {int(c): 1}
    assert broken.lines() == [
        "audit: 4 reads of 4 rows, NOT exactly once",
        f"  1 row(s) read more than once: {int(b):016x}",
        f"  1 row(s) never read: {int(c):016x}",
    ]


def test_verify_proves_a_trainers_audit_and_fails_naming_what_is_wrong(tmp_path: Path) -> None:
    channel = keyed_channel(tmp_path / "h", ["a", "b", "c"], [0.0, 1.0, 0.0])
    held = channel_row_ids(channel, "impression_id")
    good, bad = tmp_path / "good", tmp_path / "bad"
    for folder, reads in ((good, held), (bad, held[[0, 0, 1]])):
        audit = AuditWriter(folder, rank=0)
        audit.add(reads, "live")
        audit.add(np.array([99], np.uint64), "other")  # another channel's: not this one's
        audit.flush(step=1)
    assert prove_channel(channel, good).exactly_once
    runner = CliRunner()
    where = str(tmp_path / "h")
    done = runner.invoke(main, ["handoff", "verify", where, "live", "--audit", str(good)])
    assert done.exit_code == 0, done.output
    assert "audit: each of 3 rows read exactly once" in done.output
    failed = runner.invoke(
        main, ["handoff", "verify", where, "live", "--audit", str(bad), "--json"]
    )
    assert failed.exit_code == 1
    found = json.loads(failed.output)["audit"]
    assert found["duplicates"] == {f"{int(held[0]):016x}": 2}
    assert found["gaps"] == {f"{int(held[2]):016x}": 1}


def test_a_fingerprint_audit_or_a_channel_without_a_key_is_refused(tmp_path: Path) -> None:
    channel = keyed_channel(tmp_path / "h", ["a"], [0.0], commits=1)
    audit = AuditWriter(tmp_path / "a", rank=0, id_kind="fingerprint")
    audit.add(np.array([1], np.uint64), "live")
    audit.flush(step=1)
    with pytest.raises(ConfigError, match="cannot prove row identity"):
        prove_channel(channel, tmp_path / "a")
    with pytest.raises(ConfigError, match="no column 'user'"):
        prove_channel(channel, tmp_path / "a", key="user")
