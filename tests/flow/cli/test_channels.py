"""``flow handoff``: channels listed, shown, verified, retired and dropped from the terminal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from flow.cli import main
from flow.handoff import ChannelReader, ReadOptions
from tests.support import Writer, read_ids


def flow(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["handoff", *args], env=env)
    return result.exit_code, result.output


@pytest.fixture
def location(tmp_path: Path) -> Path:
    writer = Writer(tmp_path / "ns", "live", buckets=2)
    writer.commit([40, 60])
    writer.commit([30, 30])
    return tmp_path / "ns"


def test_ls_and_show_describe_the_commits(location: Path) -> None:
    code, output = flow("ls", str(location))
    assert code == 0, output
    assert "live" in output
    assert "160" in output
    code, output = flow("show", str(location), "live")
    assert code == 0, output
    assert "2 buckets" in output
    assert "id: int64" in output
    assert "last 2 of 2 commits" in output


def test_a_namespace_resolves_under_the_handoff_root(location: Path) -> None:
    env = {"FLOW_HANDOFF": str(location.parent)}
    code, output = flow("ls", "ns", env=env)
    assert code == 0, output
    assert "live" in output
    code, output = flow("ls", env=env)  # every namespace
    assert code == 0, output
    assert "live" in output


def test_verify_names_a_damaged_shard(location: Path) -> None:
    assert flow("verify", str(location), "live")[0] == 0
    shard = next((location / "live" / "shards").rglob("*.arrow"))
    shard.write_bytes(shard.read_bytes()[:-10])
    code, output = flow("verify", str(location), "live")
    assert code == 1
    assert shard.name in output
    assert "1 damaged" in output


def test_an_unknown_channel_names_those_that_exist(location: Path) -> None:
    code, output = flow("show", str(location), "backfill")
    assert code == 1
    assert "no channel 'backfill'" in output
    assert "channels there: live" in output


def test_retire_frees_what_every_group_read_and_drop_needs_yes(location: Path) -> None:
    code, output = flow("retire", str(location), "live")
    assert code == 1
    assert "no consumer groups" in output
    options = ReadOptions(batch_size=10, consumer_group="trainer", record_every=0)
    assert sum(map(len, read_ids(ChannelReader(str(location), "live", options=options)))) == 160
    code, output = flow("retire", str(location), "live")
    assert code == 0, output
    assert "read by every group up to batch 1" in output
    assert not list((location / "live" / "shards").rglob("*.arrow"))
    code, output = flow("drop", str(location), "live")
    assert code == 1
    assert "--yes" in output
    assert flow("drop", str(location), "live", "--yes")[0] == 0
    assert not (location / "live").exists()


def test_verify_names_a_missing_commit_and_exits_1(location: Path) -> None:
    (location / "live" / "commits" / f"{0:020d}.json").unlink()
    code, output = flow("verify", str(location), "live")
    assert code == 1
    lines = output.strip().splitlines()
    assert lines[0].startswith("missing: writer '(unnamed)': commit seq 0 (batch 0) missing")
    assert lines[1].startswith("orphan: orphan shard shards/00000000000000000000/")
    assert lines[-1] == (
        "2 shards checked in 1 commits: 0 damaged, 1 missing commits, 2 orphan shards, "
        "0 row count mismatches"
    )


def test_results_go_to_stdout_and_as_json_for_scripts(location: Path) -> None:
    result = CliRunner().invoke(main, ["handoff", "ls", str(location), "--json"])
    assert result.exit_code == 0, result.output
    (channel,) = json.loads(result.stdout)
    assert (channel["name"], channel["commits"], channel["rows"]) == ("live", 2, 160)
    result = CliRunner().invoke(main, ["handoff", "ls", str(location)])
    assert "live" in result.stdout, "the table is on stdout: `flow handoff ls | grep` finds it"
    shown = json.loads(
        CliRunner().invoke(main, ["handoff", "show", str(location), "live", "--json"]).stdout
    )
    assert shown["buckets"] == 2
    assert [c["rows"] for c in shown["recent_commits"]] == [100, 60]
    verified = CliRunner().invoke(main, ["handoff", "verify", str(location), "live", "--json"])
    assert verified.exit_code == 0
    report = json.loads(verified.stdout)
    assert report["ok"] is True
    assert report["problems"] == []
