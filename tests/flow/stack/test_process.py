from __future__ import annotations

import dataclasses
import socket
import sys
import time
from pathlib import Path

import psutil
import pytest

from flow.errors import PortInUseError, ServiceStartError
from flow.stack import process

# A parent that starts a child and both sleep: stop() must take down the whole session.
FAMILY = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
    "print('started', flush=True); time.sleep(300)"
)


def _spawn_family(tmp_path: Path) -> process.ProcessRecord:
    record = process.spawn([sys.executable, "-c", FAMILY], tmp_path / "family.log")
    deadline = time.monotonic() + 20
    while "started" not in process.log_tail(record.log) and time.monotonic() < deadline:
        time.sleep(0.05)
    return record


def test_stop_ends_the_process_and_its_children(tmp_path: Path) -> None:
    record = _spawn_family(tmp_path)
    children = psutil.Process(record.pid).children(recursive=True)
    assert process.alive(record)
    assert children

    process.stop(record, timeout=5)

    assert not process.alive(record)
    assert not any(
        child.is_running() and child.status() != psutil.STATUS_ZOMBIE for child in children
    )


def test_a_reused_pid_is_not_mistaken_for_the_service(tmp_path: Path) -> None:
    record = _spawn_family(tmp_path)
    try:
        impostor = dataclasses.replace(record, create_time=record.create_time - 3600)
        assert process.alive(record)
        assert not process.alive(impostor)
    finally:
        process.stop(record, timeout=5)


def test_records_survive_a_round_trip_and_garbage_reads_as_none(tmp_path: Path) -> None:
    record = process.ProcessRecord(123, 4.5, ["java", "-version"], "/tmp/x.log", 6.0)
    record.save(tmp_path / "r.json")
    assert process.ProcessRecord.load(tmp_path / "r.json") == record
    (tmp_path / "bad.json").write_text("{not json")
    assert process.ProcessRecord.load(tmp_path / "bad.json") is None
    assert process.ProcessRecord.load(tmp_path / "missing.json") is None


def test_a_taken_port_names_the_setting_to_change() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"127.0.0.1:{port}.*set FLOW_KAFKA_PORT"):
            process.ensure_port_free("127.0.0.1", port, "FLOW_KAFKA_PORT", "the Kafka broker")
        assert process.port_open("127.0.0.1", port)


def test_a_service_that_exits_while_starting_fails_fast_with_its_log(tmp_path: Path) -> None:
    script = "import sys; print('bad config: listeners'); sys.exit(3)"
    record = process.spawn([sys.executable, "-c", script], tmp_path / "svc.log")
    started = time.monotonic()
    with pytest.raises(
        ServiceStartError, match=r"exited while starting(.|\n)*bad config: listeners"
    ):
        process.wait_ready(record, lambda: False, service="svc", timeout=60)
    assert time.monotonic() - started < 30


def test_a_service_that_never_answers_is_stopped_at_the_timeout(tmp_path: Path) -> None:
    record = process.spawn(
        [sys.executable, "-c", "import time; time.sleep(300)"], tmp_path / "s.log"
    )
    with pytest.raises(ServiceStartError, match="did not become ready within 1s"):
        process.wait_ready(record, lambda: False, service="svc", timeout=1)
    assert not process.alive(record)


def test_log_tail_returns_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert process.log_tail(log, 3).splitlines() == ["line 97", "line 98", "line 99"]
    assert "no log" in process.log_tail(tmp_path / "none.log")
