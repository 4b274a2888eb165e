"""Locations on local disk (object storage: tests/flow/test_handoff_s3.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.storage import location, namespace_locations
from tests.support import stack_env_for


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


def test_a_writable_location_passes_its_check_and_keeps_no_probe(tmp_path: Path) -> None:
    folder = location(str(tmp_path)).child("handoff", "ns")
    folder.check_writable("FLOW_HANDOFF")
    assert folder.exists()  # made, as a writer would
    assert list((tmp_path / "handoff" / "ns").iterdir()) == []


def test_an_unwritable_location_names_the_setting_and_the_location(tmp_path: Path) -> None:
    # A folder under a regular file cannot be made, whoever runs the test (root ignores chmod).
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    folder = location(str(blocker)).child("ns", "backfill")
    with pytest.raises(
        ConfigError, match=rf"^FLOW_HANDOFF: cannot write to {folder.uri} \(.*\); set FLOW_HANDOFF"
    ):
        folder.check_writable("FLOW_HANDOFF")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_unwritable(tmp_path: Path) -> None:
    tmp_path.joinpath("ro").mkdir(mode=0o500)
    with pytest.raises(ConfigError, match="FLOW_FEATURE_STATE: cannot write to"):
        location(str(tmp_path / "ro")).check_writable("FLOW_FEATURE_STATE")


def test_a_root_no_filesystem_understands_names_its_setting(tmp_path: Path) -> None:
    env = {**stack_env_for(tmp_path), "FLOW_FEATURE_STATE": "s3x://bucket/states"}
    with pytest.raises(ConfigError, match=r"^FLOW_FEATURE_STATE: s3x://bucket/states is not a"):
        namespace_locations(StackConfig.from_env(env), "ctr")
