"""One terminal for a command that runs several processes at once (``flow demo``).

Spark, the trainer and the data generator all talk while the demo runs. Through a
:class:`Terminal` each of their lines is prefixed with its source's name (``spark     | ...``),
every line also goes to a log file, and lines known to be noise on a loaded machine (Spark's
"Current batch is falling behind", MLflow's cloudpickle notice) go to the log file only, counted,
so the end can say how many there were and where they are. A :class:`Ticker` says where the run
is whenever the terminal has been silent for a few seconds, set-up included: a person never
waits a minute wondering whether anything is happening.

Progress goes to stderr (the console given); a command's result stays on stdout.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, TextIO

from rich.console import Console
from rich.markup import escape

__all__ = [
    "NOISE",
    "Quiet",
    "Relayed",
    "Start",
    "Terminal",
    "Ticker",
    "call",
    "elapsed",
    "inherit",
    "prefixed",
    "to_stderr",
]

Start = Callable[[Sequence[str], Mapping[str, str]], subprocess.Popen[bytes]]
"""Starts a command (argv, its whole environment) and returns the running process."""


def inherit(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """A process writing straight to this one's stdout and stderr (what commands do alone)."""
    return subprocess.Popen(list(argv), env=dict(env))


def to_stderr(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """A process whose stdout goes to this one's stderr: a command's ``--json`` keeps stdout for
    its one document."""
    # File descriptor 2, not sys.stderr: a test or a wrapper may have replaced that object.
    return subprocess.Popen(list(argv), env=dict(env), stdout=2)


def call(start: Start, argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Run ``argv`` to its end through ``start``; its exit code. As ``subprocess.call``: an
    interrupt while waiting kills it rather than leaving it running behind the caller."""
    process = start(argv, env)
    try:
        return process.wait()
    except BaseException:
        process.kill()
        process.wait()
        raise


@dataclass(frozen=True)
class Quiet:
    """Lines that go to the log file only, and what to call them when counting them."""

    pattern: str
    """A regular expression searched for in each line."""
    what: str
    """What they are, for the count at the end (``Spark's "falling behind" warnings``)."""


NOISE = (
    Quiet(
        r"Current batch is falling behind",
        "Spark warnings that a micro-batch took longer than its trigger",
    ),
    Quiet(r"serialized using CloudPickle", "MLflow notices that a model is pickled"),
    Quiet(
        r"StateStore: Error running maintenance thread",
        "Spark warnings that its state store was not maintained as the session stopped",
    ),
    Quiet(
        r"DAGScheduler: Failed to cancel job group",
        "Spark warnings that a stopping query's jobs had already ended",
    ),
)
"""What ``flow demo`` keeps off the terminal: true, expected (on a small machine, or as the
live query stops), and no action to take; some repeat dozens of times, some carry a stack
trace, and all bury the lines that matter."""

_TRACE = re.compile(r"^\s+at |^\s*\.\.\. \d+ more|^Caused by: |^[\w.$]+(Exception|Error)(: |$)")
"""The lines of a Java stack trace after its first: they follow the noise they belong to."""


def prefixed(source: str, text: str, width: int) -> str:
    """``text`` after its source's name, padded to ``width`` so that the bars line up."""
    return f"{source:<{width}} | {text}"


class Terminal:
    """Lines of named sources to a console and to a log file; known noise to the log only.

    Safe to use from several threads (each relayed process has its own reader thread)."""

    def __init__(
        self,
        console: Console,
        log: TextIO,
        *,
        quiet: Iterable[Quiet] = NOISE,
        width: int = 9,
        clock: Callable[[], float] = time.monotonic,
        stamp: Callable[[], str] = lambda: time.strftime("%H:%M:%S"),
    ) -> None:
        self.console = console
        self.log = log
        self.quiet = [(re.compile(q.pattern), q.what) for q in quiet]
        self.width = width
        self.clock = clock
        self.stamp = stamp
        self.hidden: Counter[str] = Counter()
        """Per kind of noise (:attr:`Quiet.what`), the lines kept off the terminal."""
        self.last = clock()
        """When the terminal last got a line (``clock``'s time)."""
        self._lock = threading.Lock()
        self._in_noise: set[str] = set()
        """Sources whose last line was noise: its stack trace follows it to the log."""

    def line(self, source: str, text: str) -> None:
        """One line of ``source``: to the log file; to the terminal unless it is noise."""
        text = text.rstrip()
        shown = prefixed(source, text, self.width)
        with self._lock:
            stamp = self.stamp()
            if not self.log.closed:  # a process still talking after an interrupted run
                self.log.write(f"{stamp} {shown}\n")
                self.log.flush()
            if source in self._in_noise and _TRACE.search(text):
                return
            noise = next((what for pattern, what in self.quiet if pattern.search(text)), None)
            if noise is not None:
                self.hidden[noise] += 1
                self._in_noise.add(source)
                return
            self._in_noise.discard(source)
            # One line, however long: a line wrapped here would lose its prefix.
            self.console.print(
                f"  [dim]{stamp}[/] {escape(shown)}", highlight=False, soft_wrap=True
            )
            self.last = self.clock()

    def say_as(self, source: str) -> Callable[[str], None]:
        """A progress function whose messages are ``source``'s lines."""

        def say(message: str) -> None:
            for text in message.splitlines() or [""]:
                self.line(source, text)

        return say

    def silent_for(self, now: float) -> float:
        """Seconds since the terminal's last line."""
        return now - self.last

    def relay(self, source: str, stream: IO[bytes]) -> threading.Thread:
        """A thread that passes ``stream``'s lines on as ``source``'s until it ends."""

        def run() -> None:
            with stream:
                for raw in iter(stream.readline, b""):
                    # A progress bar redraws with carriage returns: its last state is the line.
                    text = raw.decode(errors="replace").rstrip("\r\n").rsplit("\r", 1)[-1]
                    self.line(source, text)

        thread = threading.Thread(target=run, name=f"relay-{source}", daemon=True)
        thread.start()
        return thread

    def start_as(self, source: str) -> Start:
        """A :data:`Start` whose processes' output (stdout and stderr) is ``source``'s lines."""

        def start(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
            return Relayed(argv, env, self, source)

        return start

    def noise_said(self) -> list[str]:
        """What was kept off the terminal: ``31 Spark warnings that ...``, one line a kind."""
        return [f"{n:,} {what}" for what, n in self.hidden.items()]


class Relayed(subprocess.Popen[bytes]):
    """A process whose stdout and stderr, merged, become a :class:`Terminal` source's lines.

    Python children are told not to buffer (``PYTHONUNBUFFERED``): through a pipe their prints
    would otherwise arrive in 8 kB lumps, minutes late. ``wait`` returns once the last line has
    been passed on, so what a process said comes before what its caller says next."""

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str], terminal: Terminal, source: str
    ) -> None:
        super().__init__(
            list(argv),
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        if self.stdout is None:  # Popen's typing: it is a pipe, as asked
            raise RuntimeError("a relayed process has no stdout pipe")
        self._reader = terminal.relay(source, self.stdout)

    def wait(self, timeout: float | None = None) -> int:
        code = super().wait(timeout)
        # A grandchild that outlives the process (a daemon it left) keeps the pipe open: its
        # lines still come, and the caller is not held for them.
        self._reader.join(timeout=5.0)
        return code


class Ticker:
    """A line from ``status()`` whenever ``terminal`` has been silent ``every_s`` seconds.

    It checks once a second, so the longest silence is ``every_s`` plus a second plus the time
    ``status()`` takes: 8 s keeps a line coming at least every 10 s."""

    def __init__(
        self,
        terminal: Terminal,
        status: Callable[[], str],
        *,
        source: str = "demo",
        every_s: float = 8.0,
        poll_s: float = 1.0,
    ) -> None:
        self.terminal = terminal
        self.status = status
        self.source = source
        self.every_s = every_s
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ticker", daemon=True)

    def tick(self, now: float) -> bool:
        """Say the status if the terminal has been silent long enough at ``now``; whether it
        did. A status that fails says so: the ticker outlives what it reports on."""
        if self.terminal.silent_for(now) < self.every_s:
            return False
        try:
            said = self.status()
        except Exception as error:  # a probe's failure is a line, not a crash
            said = f"still working (status unavailable: {type(error).__name__}: {error})"
        self.terminal.line(self.source, said)
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.tick(self.terminal.clock())

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)


def elapsed(seconds: float) -> str:
    """``45 s``, ``3 min 05 s``: how long a run has gone, as a person says it."""
    whole = int(seconds)
    return f"{whole} s" if whole < 60 else f"{whole // 60} min {whole % 60:02d} s"
