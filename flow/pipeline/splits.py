"""A time-based evaluation split in one line: ``pipeline.holdout("backfill", after=...)``.

A model is judged on what comes after what it learned from. Random buckets (``--holdout-share``)
mix the two in time; this split trains on the events before a moment and writes the events from
it on to a channel of their own, to evaluate on (``--eval-channel holdout``). The holdout stage
runs right after the stage it splits, in the same run, and uses the very feature state that
stage fitted (by version, never whatever LATEST is then): its rows are what the model would
have been given.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING

from flow.errors import ConfigError
from flow.pipeline.sources import DeltaSource, IcebergSource

if TYPE_CHECKING:
    from flow.pipeline.model import Pipeline, Stage

__all__ = ["time_holdout"]


def time_holdout(pipeline: Pipeline, stage: str, after: datetime, channel: str) -> Pipeline:
    """``pipeline`` with backfill ``stage`` reading its events before ``after``, and a stage
    ``<stage>_holdout`` after it reading the events from ``after`` on into ``channel``, with
    the same joins and features and the state the first one fits."""
    from flow.pipeline.model import BackfillStage

    base = pipeline.stage(stage, BackfillStage)
    events = pipeline.source(base.events, used_by=f"stage {stage!r}")
    owner = f"holdout of stage {stage!r}"
    if not isinstance(events, IcebergSource | DeltaSource) or events.event_time is None:
        raise ConfigError(f"{owner}: its events {base.events!r} need a table with event_time")
    if after.tzinfo is None:
        raise ConfigError(f"{owner}: after={after} has no time zone; give e.g. tzinfo=UTC")
    if (events.start and events.start >= after) or (events.end and events.end <= after):
        raise ConfigError(
            f"{owner}: after={after} is outside the events' range [{events.start}, {events.end})"
        )
    later = f"{base.events}_after"
    if later in pipeline.sources:
        raise ConfigError(f"{owner}: the pipeline has a source {later!r} already")
    held = replace(base, name=f"{base.name}_holdout", events=later, channel=channel, fit=False)
    stages: list[Stage] = []
    for each in pipeline.stages:
        stages += [each, held] if each is base else [each]
    sources = {
        **pipeline.sources,
        base.events: replace(events, end=after),
        later: replace(events, start=after),
    }
    return replace(pipeline, sources=sources, stages=tuple(stages))
