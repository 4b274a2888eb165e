"""What a stage did, counted to reconcile: input = training rows + dead letters (+ pending)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["StageReport"]


@dataclass
class StageReport:
    """Counts, lineage and timings of one stage run."""

    pipeline: str
    stage: str
    kind: Literal["backfill", "live"]
    channel: str
    table: str = ""
    """Where the training rows went."""
    events_input: int = 0
    """Event records read (valid or not)."""
    events_dead: int = 0
    """Event records that became dead letters (bad input, or no usable label/weight)."""
    training_rows: int = 0
    pending: int = 0
    """Live only: valid events still in the label join's state, waiting for their window."""
    duplicates: int = 0
    """Live: events dropped as repeats of a key within the watermark."""
    labels_input: int = 0
    labels_dead: int = 0
    labels_unmatched: int = 0
    """Live: label events that labelled nothing (no event of their key within the window),
    counted once the watermark passed them. Not dead letters: a click on an impression the
    stage never saw is an outcome of the data, not bad input."""
    positives: int = 0
    relabelled: int = 0
    """Live, ``immediate`` labels: rows that emit an event again as a positive (its first row,
    a negative, left at once); they are training rows but not further events."""
    feature_state: str = ""
    seconds: float = 0.0
    batches: int = 0
    pending_bound: int | None = None
    """Live: the most rows the join's state (plus rows dropped as too late) can account for."""
    dimension_misses: dict[str, int] = field(default_factory=dict)
    """Per enrichment (its source): rows whose key its table did not hold, kept with null
    columns or dead letters as the enrichment's ``on_missing`` says."""
    lineage: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    """Set on the stage's tracking run as they are (live: which writer ran it, and why)."""

    @property
    def dead_letters(self) -> int:
        """Every dead letter, the labels' too: the summary line, the run's table and the
        ``dead_letters`` metric all show this one figure."""
        return self.events_dead + self.labels_dead

    @property
    def reconciled(self) -> bool:
        """Every event read is a training row, a dead letter, a duplicate or (live) pending in
        the join.

        In a stream, ``pending`` is what the durable counts leave over; it must be non-negative
        (nothing written twice) and no more than the join's state holds (nothing lost).
        """
        events_out = self.training_rows - self.relabelled
        balanced = (
            self.events_input == events_out + self.events_dead + self.duplicates + self.pending
        )
        bounded = self.pending_bound is None or self.pending <= self.pending_bound
        return self.pending >= 0 and balanced and bounded

    def summary(self) -> dict[str, Any]:
        """The stage's row of the run's summary table, as plain data (``flow run --json``)."""
        return {
            "stage": self.stage,
            "kind": self.kind,
            "channel": self.channel,
            "events_in": self.events_input,
            "training_rows": self.training_rows,
            "dead_letters": self.dead_letters,
            "pending": self.pending,
            "positives": self.positives,
            "seconds": self.seconds,
            "reconciled": self.reconciled,
        }

    def said_missing(self) -> str:
        """``; keys not found: users 12, items 0`` for the summary line ('' without
        enrichments)."""
        if not self.dimension_misses:
            return ""
        found = ", ".join(f"{name} {n:,}" for name, n in self.dimension_misses.items())
        return f"; keys not found: {found}"

    def metrics(self) -> dict[str, float]:
        rate = self.events_input / self.seconds if self.seconds > 0 else 0.0
        return {
            "rows_in": float(self.events_input),
            "rows_out": float(self.training_rows),
            "dead_letters": float(self.dead_letters),
            "events_dead_letters": float(self.events_dead),
            "labels_in": float(self.labels_input),
            "labels_dead_letters": float(self.labels_dead),
            "labels_unmatched": float(self.labels_unmatched),
            "positives": float(self.positives),
            "relabelled": float(self.relabelled),
            "pending": float(self.pending),
            "duplicates": float(self.duplicates),
            "rows_in_per_s": rate,
            "reconciled": float(self.reconciled),
            **{f"missing.{name}": float(n) for name, n in self.dimension_misses.items()},
            **self.extra,
        }
