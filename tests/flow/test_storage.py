"""Locations on local disk (object storage: tests/flow/test_handoff_s3.py)."""

from __future__ import annotations

from pathlib import Path

from flow.storage import location


def test_a_folder_is_removed_with_everything_in_it_and_a_missing_one_is_left_alone(
    tmp_path: Path,
) -> None:
    folder = location(str(tmp_path)).child("channel")
    folder.child("shards", "00").write_bytes("a.arrow", b"rows")
    folder.write_bytes("_channel.json", b"{}")
    folder.remove()
    assert not folder.exists()
    assert location(str(tmp_path)).exists()
    folder.remove()  # already gone: nothing to do, no error
