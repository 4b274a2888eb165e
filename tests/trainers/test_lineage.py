"""Lineage tags name the snapshots and offsets behind the commits a trainer read."""

from __future__ import annotations

from pathlib import Path

from tests.trainers.channels import write
from trainers.lineage import commits_read, lineage_tags


def test_tags_give_one_value_or_the_first_and_last_positions() -> None:
    commits = {
        "live": [
            {"batch_id": 3, "source_positions": {"users.snapshot_id": 7, "offsets": {"p0": 10}}},
            {"batch_id": 4, "source_positions": {"users.snapshot_id": 7, "offsets": {"p0": 25}}},
        ],
        "backfill": [],
    }
    tags = lineage_tags(commits)
    assert tags["lineage.live.commits"] == "3..4"
    assert tags["lineage.live.users.snapshot_id"] == "7"
    assert tags["lineage.live.offsets"] == '{"p0": 10} .. {"p0": 25}'
    assert tags["lineage.backfill.commits"] == "none"


def test_an_incremental_run_s_commits_are_those_after_its_start(tmp_path: Path) -> None:
    write(tmp_path, "train", [10, 10, 10, 10])
    cursor = {"after": 2, "position": 0}  # commits up to 2 read wholly, none of 3 yet
    read = commits_read(str(tmp_path), ("train",), cursor, after=0)
    assert [c["batch_id"] for c in read["train"]] == [1, 2]
    assert lineage_tags(read)["lineage.train.commits"] == "1..2"
    assert [c["batch_id"] for c in commits_read(str(tmp_path), ("train",), cursor)["train"]] == [
        0,
        1,
        2,
    ]
