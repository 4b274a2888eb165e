"""One terminal for several processes: prefixed lines, noise in the log only, a steady ticker."""

from __future__ import annotations

import io
import os
import sys

from rich.console import Console

from flow.terminal import NOISE, Relayed, Terminal, Ticker, call, elapsed


class Clock:
    """A clock the test moves by hand: no test waits for real seconds."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def terminal(clock: Clock | None = None) -> tuple[Terminal, io.StringIO, io.StringIO]:
    shown, log = io.StringIO(), io.StringIO()
    console = Console(file=shown, width=200, color_system=None)
    made = Terminal(console, log, clock=clock or Clock(), stamp=lambda: "12:00:00")
    return made, shown, log


def test_each_line_carries_its_source_and_goes_to_the_log_too() -> None:
    said, shown, log = terminal()
    said.line("spark", "flow backfill: 3,000 rows")
    said.say_as("generator")("history: 3,000 impressions\nstream: started")
    assert shown.getvalue().splitlines() == [
        "  12:00:00 spark     | flow backfill: 3,000 rows",
        "  12:00:00 generator | history: 3,000 impressions",
        "  12:00:00 generator | stream: started",
    ]
    assert log.getvalue().splitlines()[0] == "12:00:00 spark     | flow backfill: 3,000 rows"
    assert len(log.getvalue().splitlines()) == 3


def test_known_noise_goes_to_the_log_only_and_is_counted() -> None:
    said, shown, log = terminal()
    behind = (
        "10:01:02 WARN ProcessingTimeExecutor: Current batch is falling behind. The trigger "
        "interval is 5000 milliseconds, but spent 7431 milliseconds"
    )
    pickled = (
        "2026/11/28 10:01:05 WARNING mlflow.pyfunc: Passing a Python object as `python_model` "
        "causes it to be serialized using CloudPickle, it requires exercising caution"
    )
    for _ in range(3):
        said.line("spark", behind)
    said.line("trainer", pickled)
    said.line("spark", "flow live: batch 4 committed")
    assert shown.getvalue().splitlines() == ["  12:00:00 spark     | flow live: batch 4 committed"]
    assert behind in log.getvalue()
    assert pickled in log.getvalue()
    assert said.noise_said() == [f"3 {NOISE[0].what}", f"1 {NOISE[1].what}"]


def test_the_stack_trace_of_noise_goes_with_it() -> None:
    said, shown, log = terminal()
    trace = [
        "10:58:41 WARN StateStore: Error running maintenance thread",
        "java.lang.IllegalStateException: SparkEnv not active, cannot do maintenance",
        "\tat org.apache.spark.sql.execution.streaming.state.StateStore$.doMaintenance(x:1)",
        "\tat java.base/java.lang.Thread.run(Thread.java:840)",
    ]
    for text in trace:
        said.line("spark", text)
    said.line("trainer", "    at a line of another source's")
    said.line("spark", "flow live: stopped")
    said.line("spark", "java.lang.RuntimeException: not noise: after a line that was not")
    assert shown.getvalue().splitlines() == [
        "  12:00:00 trainer   |     at a line of another source's",
        "  12:00:00 spark     | flow live: stopped",
        "  12:00:00 spark     | java.lang.RuntimeException: not noise: after a line that was not",
    ]
    assert len(log.getvalue().splitlines()) == 7
    assert said.noise_said() == [f"1 {NOISE[2].what}"]


def test_a_line_after_the_log_closed_still_reaches_the_terminal() -> None:
    said, shown, log = terminal()
    log.close()  # an interrupted run: a process may still talk as it stops
    said.line("trainer", "stopping")
    assert shown.getvalue().splitlines() == ["  12:00:00 trainer   | stopping"]


def test_a_process_s_output_is_relayed_line_by_line_under_its_name() -> None:
    said, shown, log = terminal()
    script = (
        "import os, sys; print('on stdout'); print('on stderr', file=sys.stderr); "
        "print('unbuffered', os.environ.get('PYTHONUNBUFFERED')); "
        "sys.stdout.write('10%\\r50%\\r100%\\n')"
    )
    code = call(said.start_as("trainer"), [sys.executable, "-c", script], dict(os.environ))
    assert code == 0
    lines = shown.getvalue().splitlines()
    # wait() returned after the last line was passed on: every line is there, in the order
    # written (stderr shares stdout's pipe, and nothing waits in a buffer).
    assert "  12:00:00 trainer   | on stdout" in lines
    assert "  12:00:00 trainer   | on stderr" in lines
    assert "  12:00:00 trainer   | unbuffered 1" in lines
    assert lines[-1] == "  12:00:00 trainer   | 100%"  # a progress bar's last state
    assert len(log.getvalue().splitlines()) == 4


def test_a_relayed_process_s_exit_code_is_its_own() -> None:
    said, _, _ = terminal()
    process = Relayed([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ), said, "x")
    assert process.wait() == 3


def test_the_ticker_speaks_only_after_a_silence() -> None:
    clock = Clock()
    said, shown, _ = terminal(clock)
    phases = iter(["starting the local services, 8 s in", "still starting, 16 s in"])
    ticker = Ticker(said, lambda: next(phases), every_s=8.0)
    said.line("services", "kafka: starting")
    clock.now += 7.9
    assert not ticker.tick(clock.now)
    clock.now += 0.1
    assert ticker.tick(clock.now)  # 8 s of silence: a line
    clock.now += 5
    assert not ticker.tick(clock.now)  # its own line counts: the silence starts again
    said.line("services", "kafka: up")
    clock.now += 7
    assert not ticker.tick(clock.now)  # another source spoke meanwhile
    clock.now += 1
    assert ticker.tick(clock.now)
    assert shown.getvalue().splitlines() == [
        "  12:00:00 services  | kafka: starting",
        "  12:00:00 demo      | starting the local services, 8 s in",
        "  12:00:00 services  | kafka: up",
        "  12:00:00 demo      | still starting, 16 s in",
    ]


def test_a_failing_status_is_a_line_not_the_end_of_the_ticker() -> None:
    clock = Clock()
    said, shown, _ = terminal(clock)

    def broken() -> str:
        raise OSError("commit log being rewritten")

    clock.now += 9
    assert Ticker(said, broken).tick(clock.now)
    assert "status unavailable: OSError: commit log being rewritten" in shown.getvalue()


def test_elapsed_reads_as_a_person_says_it() -> None:
    assert elapsed(45.9) == "45 s"
    assert elapsed(185) == "3 min 05 s"
