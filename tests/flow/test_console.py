"""How an error reaches the user: one line for a FlowError, the traceback with --debug."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from flow.console import (
    debug_requested,
    install_excepthook,
    reporting_errors,
    terminating_as_interrupt,
)
from flow.errors import ConfigError


def test_debug_is_asked_for_by_flag_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLOW_DEBUG", raising=False)
    assert not debug_requested(["--stage", "live"])
    assert debug_requested(["--stage", "live", "--debug"])
    for value, wanted in (("1", True), ("true", True), ("0", False), ("", False)):
        monkeypatch.setenv("FLOW_DEBUG", value)
        assert debug_requested([]) is wanted


def test_a_flow_error_is_one_line_and_exit_1_and_debug_adds_the_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLOW_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exited, reporting_errors([]):
        raise ConfigError("FLOW_X=1: use 0")
    assert exited.value.code == 1
    assert capsys.readouterr().err == "error: FLOW_X=1: use 0\n"
    with pytest.raises(SystemExit), reporting_errors(["--debug"]):
        raise ConfigError("FLOW_X=1: use 0")
    said = capsys.readouterr().err
    assert said.startswith("Traceback (most recent call last):")
    assert said.endswith("error: FLOW_X=1: use 0\n")


def test_a_bug_is_not_turned_into_an_error_line() -> None:
    with pytest.raises(KeyError), reporting_errors([]):
        raise KeyError("bug")


def test_the_hook_reports_flow_errors_and_hands_on_the_rest(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[BaseException] = []
    monkeypatch.setattr(sys, "excepthook", lambda _kind, error, _tb: seen.append(error))
    monkeypatch.setattr(sys, "argv", ["pipeline.py"])
    monkeypatch.delenv("FLOW_DEBUG", raising=False)
    install_excepthook()
    install_excepthook()  # a second time changes nothing
    error, bug = ConfigError("stage 'x': no column 'y'"), RuntimeError("bug")
    sys.excepthook(ConfigError, error, None)
    sys.excepthook(RuntimeError, bug, None)
    assert capsys.readouterr().err == "error: stage 'x': no column 'y'\n"
    assert seen == [bug]
    monkeypatch.setattr(sys, "argv", ["pipeline.py", "--debug"])
    sys.excepthook(ConfigError, error, None)
    assert seen == [bug, error]


def test_sigterm_unwinds_like_ctrl_c_and_ends_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLOW_DEBUG", raising=False)
    before = signal.getsignal(signal.SIGTERM)
    unwound: list[str] = []

    def job() -> None:
        with reporting_errors([]), terminating_as_interrupt():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises here, in the main thread
            finally:
                unwound.append("finally ran")

    with pytest.raises(SystemExit) as exited:
        job()
    assert exited.value.code == 143
    assert unwound == ["finally ran"]
    assert capsys.readouterr().err == "stopped: SIGTERM received\n"
    assert signal.getsignal(signal.SIGTERM) is before, "the handler is put back"


def test_ctrl_c_is_one_line_and_exit_130(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited, reporting_errors([]):
        raise KeyboardInterrupt
    assert exited.value.code == 130
    assert capsys.readouterr().err == "stopped: interrupted (Ctrl-C)\n"
