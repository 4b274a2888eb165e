"""The lifecycle every managed service shares, on a tiny real one: Python's HTTP server."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from flow.errors import PortInUseError, ServiceStartError
from flow.stack import process
from flow.stack.service import Launch, ManagedService, Progress
from tests.support import free_ports


class HttpService(ManagedService):
    name = "http"
    title = "the test server"
    noun = "server"
    starts = "an HTTP server"
    start_timeout_s = 20.0
    stop_timeout_s = 5.0

    def __init__(self, folder: Path, port: int, command: list[str] | None = None) -> None:
        super().__init__(folder, folder / "server.log")
        self.port = port
        self.command = command or [
            sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"
        ]  # fmt: skip
        self.prepared = 0

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def managed(self) -> bool:
        return True

    def answers(self, timeout: float) -> bool:
        return process.port_open("127.0.0.1", self.port, timeout)

    def ports(self) -> list[tuple[int, str]]:
        return [(self.port, "FLOW_TEST_PORT")]

    def prepare(self, progress: Progress) -> Launch:
        self.prepared += 1
        return Launch(self.command)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[HttpService]:
    (port,) = free_ports(1)
    started = HttpService(tmp_path / "http", port)
    yield started
    started.down()


def test_up_starts_waits_and_reports_then_down_stops(service: HttpService) -> None:
    said: list[str] = []
    assert service.status().state == "stopped"

    up = service.up(said.append)

    assert up.state == "running"
    assert up.pid is not None
    assert said[0] == f"http: starting an HTTP server on {service.address}"
    assert said[-1].startswith("http: server answers after ")
    assert service.up(said.append).pid == up.pid  # a second up starts nothing
    assert service.prepared == 1

    record = process.ProcessRecord.load(service.record_path)
    assert record is not None
    assert service.down().state == "stopped"
    assert not process.alive(record)
    assert service.status().state == "stopped"


def test_a_dead_process_is_reported_and_replaced(service: HttpService) -> None:
    first = service.up(lambda _: None)
    assert first.pid is not None
    psutil.Process(first.pid).kill()
    psutil.Process(first.pid).wait(5)

    dead = service.status()
    assert dead.state == "dead"
    assert "without `flow services down`" in dead.detail

    said: list[str] = []
    again = service.up(said.append)
    assert again.state == "running"
    assert again.pid != first.pid
    assert f"the previous server (pid {first.pid}) had died" in said[0]


def test_a_taken_port_fails_before_anything_is_prepared(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    holder = HttpService(tmp_path / "holder", port)
    holder.up(lambda _: None)
    try:
        second = HttpService(tmp_path / "second", port)
        with pytest.raises(PortInUseError, match=r"the test server needs .*set FLOW_TEST_PORT"):
            second.up(lambda _: None)
        assert second.prepared == 0
    finally:
        holder.down()


class SilentService(HttpService):
    start_timeout_s = 1.0


def test_a_service_that_never_answers_is_stopped_with_its_log(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    silent = SilentService(
        tmp_path / "silent",
        port,
        [sys.executable, "-c", "import time; print('warming up', flush=True); time.sleep(60)"],
    )
    with pytest.raises(ServiceStartError, match=r"within 1s and was stopped(.|\n)*warming up"):
        silent.up(lambda _: None)
    record = process.ProcessRecord.load(silent.record_path)
    assert record is not None
    assert not process.alive(record)
