"""A live batch's counts, as its ledger commit carries them: made here, for every writer.

Each writer sees its batch its own way (spark_jobs.live.stream_writer: one aggregation over the
cached batch; spark_jobs.live.inplan: the plan's ``observe`` metrics and the rows its one job
collected) and says what it saw as a :class:`Seen`; the stateful operators' drops come from the
batch's plan (spark_jobs.live.batch_facts.dropped_rows). :func:`batch_counts` turns the two into
the ``flow.*`` counts the stage's report sums (spark_jobs.live.run): one function, so the two
paths cannot name, default or leave out a count differently.

The training rows are not among them: each training commit carries its own rows and positives
(the stream writer's ledger commit is made beside its export, before those are known).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from flow.pipeline.model import LiveStage
from spark_jobs.joins import enrichment_names
from spark_jobs.live.batch_facts import Dropped

__all__ = ["INPUT", "Seen", "batch_counts", "records_read", "unmatched_key"]

INPUT = "flow.input."
"""The prefix of the records read per source."""


@dataclass(frozen=True)
class Seen:
    """What a writer saw of one batch, by source name (a source not named saw nothing)."""

    inputs: Mapping[str, int] = field(default_factory=dict)
    """Kafka records read."""
    invalid: Mapping[str, int] = field(default_factory=dict)
    """Records that failed parsing or the checks (malformed, out-of-range event time...)."""
    late: Mapping[str, int] = field(default_factory=dict)
    """Valid records at or before the batch's late-event threshold."""
    unusable: int = 0
    """The label join's rows (events' first rows) that cannot train: dead letters."""
    missing: Mapping[str, int] = field(default_factory=dict)
    """Per enrichment (joins.enrichment_names): events' first rows whose key it did not find."""
    unmatched: int = 0
    """Label records that labelled no event (no such event, or outside its window): known once
    the watermark has passed them, so counted in the batch that learns it."""


def unmatched_key(stage: LiveStage) -> str | None:
    """The count of the stage's labels that labelled nothing (None: the stage has no labels)."""
    return f"flow.unmatched.{stage.label.source}" if stage.label is not None else None


def batch_counts(
    stage: LiveStage, sources: Sequence[str], seen: Seen, dropped: Dropped
) -> dict[str, int]:
    """The batch's counts: per source the records read, invalid and late, and the duplicates
    the operators dropped; the events' rows that cannot train; per enrichment the keys not
    found; the labels that labelled nothing; the operators' own late drops (to check ours)."""
    counts: dict[str, int] = {}
    for name in sources:
        counts[f"{INPUT}{name}"] = int(seen.inputs.get(name, 0))
        counts[f"flow.invalid.{name}"] = int(seen.invalid.get(name, 0))
        counts[f"flow.late.{name}"] = int(seen.late.get(name, 0))
    counts[f"flow.unusable.{stage.events}"] = int(seen.unusable)
    for name in enrichment_names(stage.enrich):
        counts[f"flow.missing.{name}"] = int(seen.missing.get(name, 0))
    counts[f"flow.duplicates.{stage.events}"] = dropped.duplicate_events
    unmatched = unmatched_key(stage)
    if stage.label is not None and unmatched is not None:
        counts[f"flow.duplicates.{stage.label.source}"] = dropped.duplicate_labels
        counts[unmatched] = int(seen.unmatched)
    counts["flow.operators_late"] = dropped.late  # Spark's own count, to check ours against
    return counts


def records_read(counts: Mapping[str, int]) -> int:
    """The Kafka records a batch read, all sources (what the supervisor's progress shows)."""
    return sum(n for k, n in counts.items() if k.startswith(INPUT))
