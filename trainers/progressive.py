"""Progressive validation: every batch scored before the model trains on it, in several cuts.

A batch's predictions count towards the figures since the last log line (``progressive``), the
whole run (``overall``), its channel (``by_channel``), its pass (``by_pass``: ``first_seen`` or
``repeated``, i.e. rows of epoch 1 and later, which the model has trained on before, so their
figures are no measure of generalisation) and, for rows seen for the first time, the window of
event time they fall in (:class:`EventWindows`, per channel). The figures of rows from an
``immediate`` channel carry their corrected positive rate and calibration, and their AUC is one
over impressions when the batches carry the rows' label keys; with an oracle column, the
oracle's AUC and log loss over the same rows (see :mod:`trainers.metrics`).

Memory is bounded: every cut keeps a bounded reservoir of predictions for its AUC (its sums stay
exact), and at most ``max_windows`` event-time windows are open at once; past that the oldest
is closed (its figures kept) and rows arriving for it later are counted, not scored.

Predictions stay on the device until a log step: moving them to the host every step would
make every step wait for the GPU, and the loader's copy-ahead would be for nothing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from flow.errors import ConfigError
from trainers.data import NO_KEY, NO_TIME
from trainers.metrics import Scores

__all__ = ["PASSES", "EventWindows", "ProgressiveScores"]

PASSES = ("first_seen", "repeated")
"""The two passes figures are split by: rows seen for the first time, and rows seen again."""


@dataclass
class _Scored:
    """One batch's predictions and what they are scored against, waiting for a log step."""

    channel: str
    logits: torch.Tensor
    labels: torch.Tensor
    weights: torch.Tensor | None
    immediate: bool
    repeated: bool
    oracle: np.ndarray | None
    event_us: np.ndarray | None
    keys: np.ndarray | None = None


@dataclass
class _Rows:
    """A group of scored rows on the host."""

    logits: np.ndarray
    labels: np.ndarray
    weights: np.ndarray | None
    oracle: np.ndarray | None
    event_us: np.ndarray | None
    keys: np.ndarray | None = None

    def score(self, scores: Scores, *, immediate: bool) -> None:
        """Add these rows to ``scores``."""
        scores.update(
            self.logits,
            self.labels,
            self.weights,
            immediate=immediate,
            oracle=self.oracle,
            keys=self.keys,
        )

    def take(self, rows: np.ndarray) -> _Rows:
        def pick(values: np.ndarray | None) -> np.ndarray | None:
            return None if values is None else values[rows]

        return _Rows(
            self.logits[rows],
            self.labels[rows],
            pick(self.weights),
            pick(self.oracle),
            pick(self.event_us),
            pick(self.keys),
        )


class EventWindows:
    """Progressive figures per channel and event-time window of ``seconds``, memory bounded.

    Windows are keyed by their start (whole seconds since the epoch). Each open window keeps a
    reservoir of ``capacity`` predictions for its AUC; at most ``max_windows`` are open, and
    opening one more closes the one that starts first (its figures are kept; rows that arrive
    for it later are counted in ``late`` and not scored). Rows without an event time are
    counted in ``untimed``.
    """

    def __init__(
        self,
        seconds: float,
        *,
        oracle: bool = False,
        max_windows: int = 168,
        capacity: int = 20_000,
    ) -> None:
        if seconds < 0 or max_windows < 1:
            raise ConfigError(
                f"event windows of {seconds} s, {max_windows} open at most: give seconds >= 0 "
                "(0: none) and 1 window or more"
            )
        self.width_us = round(seconds * 1e6)
        self.oracle = oracle
        self.max_windows = max_windows
        self.capacity = capacity
        self.open: dict[tuple[str, int], Scores] = {}
        self.closed: dict[tuple[str, int], dict[str, float]] = {}
        self.late: Counter[str] = Counter()
        self.untimed: Counter[str] = Counter()

    @property
    def enabled(self) -> bool:
        return self.width_us > 0

    def update(self, channel: str, rows: _Rows, *, immediate: bool) -> None:
        if not self.enabled:
            return
        if rows.event_us is None:
            self.untimed[channel] += len(rows.logits)
            return
        timed = rows.event_us != NO_TIME
        self.untimed[channel] += int(np.count_nonzero(~timed))
        starts = np.full(len(timed), -1, dtype=np.int64)
        starts[timed] = rows.event_us[timed] // self.width_us * self.width_us // 1_000_000
        for start in np.unique(starts[timed]).tolist():
            chosen = rows.take(np.flatnonzero(timed & (starts == start)))
            key = (channel, int(start))
            if key in self.closed:
                self.late[channel] += len(chosen.logits)
                continue
            chosen.score(self.open.get(key) or self._open(key), immediate=immediate)

    def _open(self, key: tuple[str, int]) -> Scores:
        if len(self.open) >= self.max_windows:
            oldest = min(self.open, key=lambda k: (k[1], k[0]))
            self.closed[oldest] = self.open.pop(oldest).compute()
        scores = self.open[key] = Scores(self.capacity, oracle=self.oracle)
        return scores

    def compute(self) -> dict[str, dict[int, dict[str, float]]]:
        """Per channel, per window start (seconds since the epoch): the window's figures."""
        found: dict[str, dict[int, dict[str, float]]] = {}
        figures = self.closed | {k: s.compute() for k, s in self.open.items() if s.count}
        for (channel, start), values in sorted(figures.items(), key=lambda i: (i[0][0], i[0][1])):
            found.setdefault(channel, {})[start] = values
        return found

    def left_out(self) -> dict[str, dict[str, int]]:
        """Per channel, rows no window scored: ``untimed`` (no event time) and ``late`` (their
        window was closed)."""
        channels = {c for c, n in (self.untimed + self.late).items() if n}
        return {c: {"untimed": self.untimed[c], "late": self.late[c]} for c in sorted(channels)}


class ProgressiveScores:
    """Progressive validation figures since the last log step, over the run, per channel, per
    pass and per event-time window (see the module's docstring)."""

    def __init__(self, *, oracle: bool = False, window_s: float = 0.0) -> None:
        self.oracle = oracle
        self.pending: list[_Scored] = []
        self.progressive = Scores(1_000_000, oracle=oracle)
        """Since the last log step."""
        self.overall = Scores(2_000_000, oracle=oracle)
        self.by_channel: dict[str, Scores] = {}
        self.by_pass: dict[str, Scores] = {}
        self.windows = EventWindows(window_s, oracle=oracle)
        self.frozen: dict[str, Scores] = {}
        """Per channel, the figures of the model frozen after an earlier channel (add_frozen)."""
        self.frozen_pending: list[
            tuple[str, torch.Tensor, torch.Tensor, torch.Tensor | None, bool, np.ndarray | None]
        ] = []

    def add(
        self,
        channel: str | None,
        logits: torch.Tensor,
        batch: dict[str, torch.Tensor],
        *,
        immediate: bool = False,
        repeated: bool = False,
        oracle: np.ndarray | None = None,
        event_time_us: np.ndarray | None = None,
        keys: np.ndarray | None = None,
    ) -> None:
        """A batch's predictions, before the model trains on it; ``repeated``: its rows were
        trained on before (a later epoch); ``keys``: the rows' label keys (hashed), with which
        an immediate channel's AUC is one over impressions."""
        self.pending.append(
            _Scored(
                channel or "?",
                logits.detach().float(),
                batch["label"],
                batch.get("weight"),
                immediate,
                repeated,
                oracle if self.oracle else None,
                event_time_us,
                keys,
            )
        )

    def add_frozen(
        self,
        channel: str | None,
        logits: torch.Tensor,
        batch: dict[str, torch.Tensor],
        *,
        immediate: bool = False,
        keys: np.ndarray | None = None,
    ) -> None:
        """A batch's predictions by the frozen copy of the model (scored per channel only)."""
        self.frozen_pending.append(
            (
                channel or "?",
                logits.detach().float(),
                batch["label"],
                batch.get("weight"),
                immediate,
                keys,
            )
        )

    def flush(self) -> None:
        """Score what was added since the last flush (copies it to the host: a sync)."""
        for channel, logits, labels, weights, immediate, keys in self.frozen_pending:
            frozen = self.frozen.setdefault(channel, Scores(1_000_000))
            weight = weights.cpu() if weights is not None else None
            frozen.update(logits.cpu(), labels.cpu(), weight, immediate=immediate, keys=keys)
        self.frozen_pending = []
        groups: dict[tuple[str, bool, bool], list[_Scored]] = {}
        for scored in self.pending:
            groups.setdefault((scored.channel, scored.immediate, scored.repeated), []).append(
                scored
            )
        self.pending = []
        for (channel, immediate, repeated), items in groups.items():
            rows = _host(items)
            cut = PASSES[1] if repeated else PASSES[0]
            for scores in (
                self.progressive,
                self.overall,
                self.by_channel.setdefault(channel, Scores(1_000_000, oracle=self.oracle)),
                self.by_pass.setdefault(cut, Scores(1_000_000, oracle=self.oracle)),
            ):
                rows.score(scores, immediate=immediate)
            if not repeated:
                self.windows.update(channel, rows, immediate=immediate)


def _host(items: list[_Scored]) -> _Rows:
    """A group's rows on the host, one copy per kind; a batch without weights weighs 1, one
    without an oracle or event times has NaN and NO_TIME."""

    def numpy(parts: list[torch.Tensor]) -> np.ndarray:
        values: np.ndarray = torch.cat([p.reshape(-1).float() for p in parts]).cpu().numpy()
        return values

    def filled(parts: list[np.ndarray | None], marker: float | int, kind: type) -> np.ndarray:
        return np.concatenate(
            [
                p if p is not None else np.full(len(i.logits.reshape(-1)), marker, dtype=kind)
                for p, i in zip(parts, items, strict=True)
            ]
        )

    weights = None
    if any(i.weights is not None for i in items):
        weights = numpy(
            [i.weights if i.weights is not None else torch.ones_like(i.logits) for i in items]
        )
    oracles = [i.oracle for i in items]
    times = [i.event_us for i in items]
    keys = [i.keys for i in items]
    return _Rows(
        numpy([i.logits for i in items]),
        numpy([i.labels for i in items]),
        weights,
        filled(oracles, np.nan, np.float64) if any(o is not None for o in oracles) else None,
        filled(times, NO_TIME, np.int64) if any(t is not None for t in times) else None,
        filled(keys, NO_KEY, np.int64) if any(k is not None for k in keys) else None,
    )
