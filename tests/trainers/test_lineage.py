"""Lineage tags name the snapshots and offsets behind the commits a trainer read."""

from __future__ import annotations

from trainers.lineage import lineage_tags


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
