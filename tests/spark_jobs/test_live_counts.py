"""A live batch's counts, made in one place for both writers (spark_jobs.live.counts)."""

from __future__ import annotations

from dataclasses import replace

from flow.pipeline.model import Enrich, LiveStage
from pipelines.ctr_streaming import ctr_streaming
from spark_jobs.live.batch_facts import Dropped
from spark_jobs.live.counts import Seen, batch_counts, records_read, unmatched_key


def _stage(**changes: object) -> LiveStage:
    return replace(ctr_streaming().stage("live", LiveStage), **changes)  # type: ignore[arg-type]


def test_every_count_is_named_for_every_source_even_when_nothing_was_seen() -> None:
    """A batch that saw nothing still carries each count (0): the report sums the same keys
    over every commit, whichever writer made it."""
    stage = _stage()
    assert stage.label is not None
    names = [stage.events, stage.label.source]
    counts = batch_counts(stage, names, Seen(), Dropped())
    for name in names:
        for kind in ("input", "invalid", "late", "duplicates"):
            assert counts[f"flow.{kind}.{name}"] == 0
    assert counts[f"flow.unusable.{stage.events}"] == 0
    assert counts[f"flow.unmatched.{stage.label.source}"] == 0
    assert counts["flow.operators_late"] == 0
    assert {f"flow.missing.{e.source}" for e in stage.enrich} <= set(counts)


def test_what_a_writer_saw_and_the_operators_dropped_become_the_batch_s_counts() -> None:
    stage = _stage()
    assert stage.label is not None
    events, labels = stage.events, stage.label.source
    seen = Seen(
        inputs={events: 10, labels: 4},
        invalid={events: 2},
        late={labels: 1},
        unusable=3,
        missing={stage.enrich[0].source: 5},
        unmatched=2,
    )
    counts = batch_counts(
        stage, [events, labels], seen, Dropped(late=1, duplicate_events=1, duplicate_labels=2)
    )
    assert counts[f"flow.input.{events}"] == 10
    assert counts[f"flow.input.{labels}"] == 4
    assert counts[f"flow.invalid.{events}"] == 2
    assert counts[f"flow.invalid.{labels}"] == 0
    assert counts[f"flow.late.{labels}"] == 1
    assert counts[f"flow.unusable.{events}"] == 3
    assert counts[f"flow.missing.{stage.enrich[0].source}"] == 5
    assert counts[f"flow.duplicates.{events}"] == 1
    assert counts[f"flow.duplicates.{labels}"] == 2
    assert counts[f"flow.unmatched.{labels}"] == 2
    assert counts["flow.operators_late"] == 1
    assert records_read(counts) == 14


def test_a_stage_without_labels_counts_no_label_outcomes() -> None:
    stage = _stage(label=None)
    counts = batch_counts(stage, [stage.events], Seen(inputs={stage.events: 3}), Dropped())
    assert unmatched_key(stage) is None
    assert not [k for k in counts if k.startswith(("flow.unmatched.", "flow.duplicates.c"))]
    assert records_read(counts) == 3


def test_one_table_enriched_twice_is_counted_under_each_prefix() -> None:
    stage = _stage(
        enrich=(
            Enrich("users", on="user_id", columns=("country",), prefix="buyer_"),
            Enrich("users", on="seller_id", columns=("country",), prefix="seller_"),
        )
    )
    seen = Seen(missing={"buyer_users": 1, "seller_users": 2})
    counts = batch_counts(stage, [stage.events], seen, Dropped())
    assert (counts["flow.missing.buyer_users"], counts["flow.missing.seller_users"]) == (1, 2)
