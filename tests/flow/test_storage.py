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


def test_list_names_files_or_folders_sorted_without_hidden_ones(tmp_path: Path) -> None:
    folder = location(str(tmp_path)).child("channel")
    assert folder.list() == []  # not there yet
    for name in ("b.json", "a.json", "notes.txt", ".a.json.123.tmp"):
        folder.write_bytes(name, b"{}")
    for sub in ("shards", "consumers", ".trash"):
        folder.child(sub).write_bytes("x", b"")
    assert folder.list() == ["a.json", "b.json", "notes.txt"]
    assert folder.list(".json") == ["a.json", "b.json"]
    assert folder.list(folders=True) == ["consumers", "shards"]
    assert folder.list("ers", folders=True) == ["consumers"]
