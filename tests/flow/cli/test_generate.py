"""``flow generate``: history in a local catalog, then a real-time stream into a stub Kafka."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import pytest
from click.testing import CliRunner

from flow.cli import main
from flow.config import StackConfig
from flow.workflows import loading
from tests.support import stack_env_for


def said(output: str) -> str:
    """The output with the console's line wrapping undone."""
    return " ".join(output.split())


class StubSink:
    """Stands in for the Kafka producer: keeps what it is sent."""

    sent: ClassVar[list[tuple[str, str, bytes]]] = []

    def __init__(self, _stack: object, _namespace: str) -> None:
        StubSink.sent = []

    def send(self, kind: str, key: str, payload: bytes) -> None:
        StubSink.sent.append((kind, key, payload))

    def close(self) -> None:
        return None


def test_a_realtime_stream_continues_the_history_s_world(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = stack_env_for(tmp_path)
    runner = CliRunner()
    history = ["generate", "history", "--days", "1", "--per-day", "500", "--users", "100"]
    done = runner.invoke(main, [*history, "--items", "40"], env=env)
    assert done.exit_code == 0, done.output
    assert "world: drift 0.7, 30% of items arriving over 14 days" in said(done.output)
    monkeypatch.setattr(loading, "_KafkaSink", StubSink)
    args = ["generate", "stream", "--realtime", "--rate", "300", "--duration", "1"]
    done = runner.invoke(main, args, env=env)
    assert done.exit_code == 0, done.output
    impressions = [p for kind, _, p in StubSink.sent if kind == "impressions"]
    assert 200 < len(impressions) <= 300
    assert "clicks not yet due (not sent)" in said(done.output)
    assert "click delay: exponential, mean 45s; 4% late (36-90 min" in said(done.output)
    valid = [json.loads(p) for p in impressions if p.startswith(b"{")]
    assert all(0 < r["p_click"] < 1 for r in valid)


def test_history_records_the_world_s_interactions(tmp_path: Path) -> None:
    env = stack_env_for(tmp_path)
    history = ["generate", "history", "--days", "1", "--per-day", "200", "--users", "50"]
    static = ["--items", "30", "--drift", "0", "--new-items", "0", "--interactions", "1.5"]
    done = CliRunner().invoke(main, [*history, *static], env=env)
    assert done.exit_code == 0, done.output
    assert "interactions 1.5" in said(done.output)
    world = loading.dimensions(StackConfig.from_env(env)).world
    assert (world.interactions, world.drift, world.new_items) == (1.5, 0.0, 0.0)


def test_realtime_and_back_dated_options_do_not_mix(tmp_path: Path) -> None:
    env = stack_env_for(tmp_path)
    done = CliRunner().invoke(main, ["generate", "stream", "--duration", "5"], env=env)
    assert done.exit_code == 2
    assert "--duration is for --realtime streams" in said(done.output)
