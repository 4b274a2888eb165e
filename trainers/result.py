"""The figures of a training run (:class:`TrainResult`), as MLflow metrics and as lines for people.

Each rank fills its own result; rank 0's is tracked and printed. Metric names:
``run_progressive_<metric>`` over every row, ``run_progressive_<metric>.<channel>`` per channel,
``run_progressive_first_seen_<metric>`` and ``run_progressive_repeated_<metric>`` by pass,
``window_progressive_<metric>.<channel>`` per event-time window (the window's start, in seconds
since the epoch, is the metric's step), ``freshness_p50_s.<channel>`` (event -> trained) and
``freshness_produced_p50_s.<channel>`` (produced -> trained), and their p99; for a followed
channel, the trainer's legs of it measured: ``committed_to_picked_up_p50_s.<channel>`` (each
commit to the poll that found it, weighed by its rows), ``picked_up_to_trained_p50_s.<channel>``
and ``ready_to_trained_p50_s.<channel>`` (per batch: see :func:`trainer_legs`), and their p99.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

import numpy as np

from trainers.promote import Decision

if TYPE_CHECKING:
    from flow.handoff import Origin

__all__ = [
    "FRESHNESS", "LEGS", "Since", "TrainResult", "final_metrics", "freshness_legs",
    "freshness_series", "headline", "leg_quantile", "summary_lines", "trainer_legs",
]  # fmt: skip

Since = Literal["event", "produced"]
"""Freshness counted from the event, or from the row's production (its Kafka record)."""
FRESHNESS: tuple[tuple[Since, str], ...] = (
    ("event", "freshness"),
    ("produced", "freshness_produced"),
)
"""Each kind of freshness and the prefix of its metric names."""
LEGS = {
    "committed_to_picked_up": "committed -> picked up",
    "picked_up_to_trained": "picked up -> trained",
    "ready_to_trained": "window ready -> trained",
}
"""The trainer's legs of a followed channel's freshness, measured (see :func:`trainer_legs`),
and their names for people."""


@dataclass
class TrainResult:
    steps: int = 0
    rows: int = 0
    """Rows this rank trained on."""
    seconds: float = 0.0
    wait_seconds: float = 0.0
    resumed_from: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    """The last evaluation (or progressive validation) metrics."""
    freshness_s: dict[str, list[float]] = field(default_factory=dict)
    """Per channel, per batch: seconds from the rows' median event time to the step using them."""
    freshness_produced_s: dict[str, list[float]] = field(default_factory=dict)
    """Per channel, per batch with production times: seconds from the median time its rows were
    produced (the Kafka record's time; null in backfill rows) to the step using them."""
    freshness_produced_at: dict[str, list[float]] = field(default_factory=dict)
    """When each entry of ``freshness_produced_s`` was taken (seconds since the epoch): where
    in a run its slowest batches were."""
    picked_up_to_trained_s: dict[str, list[float]] = field(default_factory=dict)
    """Per followed channel, per batch: seconds from its rows' pick-up to the step using them
    (see :func:`trainer_legs`)."""
    ready_to_trained_s: dict[str, list[float]] = field(default_factory=dict)
    """Per followed channel, per batch: seconds from its window's rows being read and cut into
    batches to the step (the rest of picked up -> trained is reading and filling the window)."""
    committed_to_picked_up_s: dict[str, dict[int, tuple[int, float]]] = field(default_factory=dict)
    """Per followed channel, per commit trained on: its rows, and seconds from its commit to the
    reader's poll that found it (the writer's clock against the trainer's)."""
    overall: dict[str, float] = field(default_factory=dict)
    """Progressive validation over the whole run (every batch scored before training on it)."""
    by_channel: dict[str, dict[str, float]] = field(default_factory=dict)
    """The same, per channel (e.g. how the model did on live rows it had not seen)."""
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    """Per channel trained on: its label ``strategy`` and the loss ``correction`` used."""
    by_pass: dict[str, dict[str, float]] = field(default_factory=dict)
    """The same, over rows seen for the first time (``first_seen``) and again (``repeated``,
    epochs after the first: no measure of generalisation)."""
    by_window: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)
    """Per channel, per event-time window (its start, seconds since the epoch): the same over
    rows seen for the first time."""
    window_left_out: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per channel, rows no window scored: ``untimed`` (no event time), ``late`` (their window
    had been closed to bound memory)."""
    run_id: str | None = None
    model_uri: str | None = None
    model_version: str | None = None
    decision: Decision | None = None
    best_step: int | None = None
    """With early stopping: the step of the best evaluation, whose model the run reports."""
    stopped_early: bool = False
    """Early stopping ended the run (its evaluation figure stopped improving)."""
    """Whether the new model became the champion, and why (with --promote-margin)."""
    leader: bool = True
    """Rank 0: the rank that tracks, exports and reports."""
    world_size: int = 1
    pruned: bool = False
    """A watcher of the evaluations (``flow tune``'s pruner) stopped the run; its model is not
    exported: nobody is to use it."""
    model_tags: dict[str, str] = field(default_factory=dict)
    """What a registry version of the exported model is tagged with (its run, feature state,
    channels, commits; see trainers.promote.version_tags), whether or not it was registered:
    registered later (``flow tune``'s best trial), it says the same."""

    def add_origin(self, channel: str, origin: Origin, trained_s: float) -> None:
        """A batch of a followed channel trained at ``trained_s``: its legs, and the pick-ups
        of commits not seen before."""
        legs = trainer_legs(origin, trained_s)
        if legs is None:
            return
        self.picked_up_to_trained_s.setdefault(channel, []).append(legs[0])
        self.ready_to_trained_s.setdefault(channel, []).append(legs[1])
        commits = self.committed_to_picked_up_s.setdefault(channel, {})
        for pickup in origin.commits:
            if pickup.batch_id not in commits:
                commits[pickup.batch_id] = (pickup.rows, pickup.waited_s)

    def leg(self, name: str, quantile: float, channel: str) -> float | None:
        """A quantile of one of the trainer's :data:`LEGS` of ``channel`` (None: none)."""
        if name == "committed_to_picked_up":
            commits = list(self.committed_to_picked_up_s.get(channel, {}).values())
            return leg_quantile([s for _, s in commits], quantile, [r for r, _ in commits])
        batches = {
            "picked_up_to_trained": self.picked_up_to_trained_s,
            "ready_to_trained": self.ready_to_trained_s,
        }[name]
        return leg_quantile(batches.get(channel, []), quantile)

    def times_since(self, since: Since) -> dict[str, list[float]]:
        return self.freshness_s if since == "event" else self.freshness_produced_s

    @property
    def samples_per_s(self) -> float:
        """Over all ranks (each reads the same number of rows)."""
        return self.rows * self.world_size / self.seconds if self.seconds else 0.0

    @property
    def stall_fraction(self) -> float:
        return self.wait_seconds / self.seconds if self.seconds else 0.0

    def freshness(
        self,
        quantile: float,
        channel: str | None = None,
        since: Since = "event",
    ) -> float | None:
        """A quantile of seconds from the event (or from its row's production) to training,
        of one channel or all (None: no times)."""
        per_channel = self.times_since(since)
        values = [
            v for name, found in per_channel.items() if channel in (None, name) for v in found
        ]
        return float(np.quantile(values, quantile)) if values else None


def freshness_series(result: TrainResult) -> dict[str, list[list[float]]]:
    """Per channel, each batch's ``[seconds since the channel's first batch, produced ->
    trained seconds]``: where in a run its slowest batches were (a quantile does not say)."""
    return {
        name: [
            [round(at - times[0], 2), round(lag, 2)]
            for at, lag in zip(times, result.freshness_produced_s[name], strict=True)
        ]
        for name, times in result.freshness_produced_at.items()
    }


def trainer_legs(origin: Origin, trained_s: float) -> tuple[float, float] | None:
    """(picked up -> trained, window ready -> trained) seconds of a batch of ``origin``'s
    window trained at ``trained_s``; None when no commit of the window is known.

    A shuffle window mixes commits, and a batch is a uniform sample of its window: picked up
    -> trained is the mean over the window's rows of ``trained_s`` less their commit's pick-up
    (each commit weighed by its rows in the window), not the oldest commit's (an upper bound
    that one straggling carried row would set)."""
    rows = np.asarray(origin.rows, dtype=np.float64)
    if not len(rows) or not rows.sum():
        return None
    found = np.array([p.found_s for p in origin.commits])
    return trained_s - float(np.average(found, weights=rows)), trained_s - origin.ready_s


def leg_quantile(
    values: list[float], quantile: float, weights: list[int] | None = None
) -> float | None:
    """A quantile of ``values`` (None: none); with ``weights``, each value counted that many
    times (a commit's rows), and the value at the quantile taken, not interpolated."""
    if not values:
        return None
    if weights is None:
        return float(np.quantile(values, quantile))
    order = np.argsort(values)
    sorted_values = np.asarray(values, dtype=np.float64)[order]
    cumulative = np.cumsum(np.asarray(weights, dtype=np.float64)[order])
    if not cumulative[-1]:
        return None
    at = int(np.searchsorted(cumulative, quantile * cumulative[-1], side="left"))
    return float(sorted_values[min(at, len(values) - 1)])


def freshness_legs(result: TrainResult) -> dict[str, dict[str, list[list[float]]]]:
    """Per followed channel, the trainer's legs in full (``freshness_legs.json``): ``commits``,
    ``[batch id, rows, committed -> picked up seconds]`` per commit; ``batches``, ``[picked up
    -> trained, window ready -> trained]`` seconds per batch, in order."""
    return {
        name: {
            "commits": [
                [batch_id, rows, round(waited, 3)]
                for batch_id, (rows, waited) in result.committed_to_picked_up_s.get(
                    name, {}
                ).items()
            ],
            "batches": [
                [round(picked, 3), round(ready, 3)]
                for picked, ready in zip(picked_up, result.ready_to_trained_s[name], strict=True)
            ],
        }
        for name, picked_up in result.picked_up_to_trained_s.items()
    }


def final_metrics(result: TrainResult) -> dict[str, float]:
    """The figures of a run as MLflow metrics (the per-window ones are logged with the
    window's start as their step)."""
    final: dict[str, float] = {
        "samples_per_s": result.samples_per_s,
        "data_stall_fraction": result.stall_fraction,
        "steps": result.steps,
        "rows": result.rows,
        **({"best_step": result.best_step} if result.best_step is not None else {}),
        **{f"run_progressive_{k}": v for k, v in result.overall.items()},
    }
    for channel, scores in result.by_channel.items():
        final |= {f"run_progressive_{k}.{channel}": v for k, v in scores.items()}
    for cut, scores in result.by_pass.items():
        final |= {f"run_progressive_{cut}_{k}": v for k, v in scores.items()}
    for since, prefix in FRESHNESS:
        for channel in result.times_since(since):
            for q in (0.5, 0.99):
                value = result.freshness(q, channel, since=since)
                final[f"{prefix}_p{round(q * 100)}_s.{channel}"] = value or 0
    for channel in result.picked_up_to_trained_s:
        for name in LEGS:
            for q in (0.5, 0.99):
                final[f"{name}_p{round(q * 100)}_s.{channel}"] = result.leg(name, q, channel) or 0
    return final


def _figures(scores: dict[str, float]) -> str:
    """One line of progressive figures: AUC, log loss, calibration (the corrected ones where
    rows were labelled at once), the oracle's beside them."""
    parts = [f"AUC {scores['auc']:.4f}", f"log loss {scores['logloss']:.4f}"]
    if "calibration_corrected" in scores:
        parts += [
            f"positive rate {scores['positive_rate']:.4f} "
            f"(corrected {scores['positive_rate_corrected']:.4f})",
            f"calibration (corrected) {scores['calibration_corrected']:.3f}",
        ]
    else:
        parts += [
            f"positive rate {scores['positive_rate']:.4f}",
            f"calibration {scores['calibration']:.3f}",
        ]
    if "oracle_auc" in scores:
        parts.append(
            f"oracle AUC {scores['oracle_auc']:.4f}, log loss {scores['oracle_logloss']:.4f}"
        )
    if scores.get("oracle_missing"):
        parts.append(f"{scores['oracle_missing']:,.0f} rows without an oracle value")
    return f"{scores['count']:,.0f} rows: " + ", ".join(parts)


def headline(scores: dict[str, float], result: TrainResult) -> str:
    """The run's evaluation figures in one line, last: the figures of the model it keeps."""
    kept = result.best_step if result.best_step is not None else result.steps
    which = (
        f"step {kept} of {result.steps}, the best evaluated, kept"
        if kept != result.steps
        else f"step {kept}, the model kept"
    )
    return (
        f"evaluation: AUC {scores.get('auc', math.nan):.4f}, "
        f"log loss {scores.get('logloss', math.nan):.4f}, "
        f"calibration {scores.get('calibration', math.nan):.3f} ({which})"
    )


SHOWN_WINDOWS = 12
"""Event-time windows a summary prints per channel (the latest); MLflow has them all."""


def summary_lines(result: TrainResult) -> list[str]:
    """The run's progressive figures as lines for people: per channel (with how its rows were
    labelled), first-seen against repeated rows, the latest event-time windows, freshness."""
    lines = []
    if result.overall:
        lines.append(f"progressive, all rows: {_figures(result.overall)}")
    for channel, scores in result.by_channel.items():
        labels = result.labels.get(channel, {})
        how = f" [labels {labels['strategy']}, loss {labels['correction']}]" if labels else ""
        lines.append(f"progressive, channel {channel}{how}: {_figures(scores)}")
    for cut, scores in result.by_pass.items():
        note = " (trained on before: not generalisation)" if cut == "repeated" else ""
        lines.append(f"progressive, {cut.replace('_', ' ')} rows{note}: {_figures(scores)}")
    for channel, windows in result.by_window.items():
        starts = sorted(windows)
        shown = starts[-SHOWN_WINDOWS:]
        more = f", the last {len(shown)} of {len(starts)}" if len(shown) < len(starts) else ""
        lines.append(f"progressive per event-time window, channel {channel}{more}:")
        for start in shown:
            when = datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%d %H:%M:%S")
            lines.append(f"  {when} UTC: {_figures(windows[start])}")
    for channel, left in result.window_left_out.items():
        if left["untimed"] or left["late"]:
            lines.append(
                f"  channel {channel}: {left['untimed']:,} rows without an event time and "
                f"{left['late']:,} for windows already closed are in no window"
            )
    for since, _ in FRESHNESS:
        for channel in result.times_since(since):
            p50 = result.freshness(0.5, channel, since=since) or 0
            p99 = result.freshness(0.99, channel, since=since) or 0
            lines.append(
                f"freshness {since} -> trained, channel {channel}: p50 {p50:.1f} s, p99 {p99:.1f} s"
            )
    for channel in result.picked_up_to_trained_s:
        legs = [
            f"{label} p50 {result.leg(name, 0.5, channel) or 0:.1f} s, "
            f"p99 {result.leg(name, 0.99, channel) or 0:.1f} s"
            for name, label in LEGS.items()
        ]
        lines.append(f"freshness by leg, channel {channel}: " + "; ".join(legs))
    return lines
