"""A backfill stage: table history, validated, labelled, enriched, fitted, featurized, written.

The stage replaces its channel's training rows (a backfill recomputes the history it covers)
and its own earlier dead letters, so running it twice gives the same tables, not twice the rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import reduce

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.pipeline.model import BackfillStage, HandoffOutput, Pipeline
from flow.pipeline.sources import DeltaSource, IcebergSource, TableSource
from flow.pipeline.state import FeatureState, states_location
from spark_jobs.features import fit_state, training_rows
from spark_jobs.handoff import export
from spark_jobs.joins import enrich, label_batch
from spark_jobs.report import StageReport
from spark_jobs.rows import (
    channel_for,
    dead_letter_table,
    export_options,
    split_unusable,
    training_table,
)
from spark_jobs.sinks import DEAD_LETTER_SCHEMA, dead_letter_rows, ensure_table
from spark_jobs.sources import read_table
from spark_jobs.validate import REASON, split, validate_table

__all__ = ["run_backfill"]

Progress = Callable[[str], None]


def _table_source(pipeline: Pipeline, name: str) -> TableSource:
    source = pipeline.sources[name]
    if not isinstance(source, IcebergSource | DeltaSource):
        raise ConfigError(f"source {name!r} is not a table; a backfill stage reads tables")
    return source


def _event_time(source: TableSource, name: str) -> str:
    if source.event_time is None:
        raise ConfigError(f"source {name!r} needs event_time for the label join")
    return source.event_time


def _counts(checked: DataFrame) -> tuple[int, int]:
    """(rows, invalid rows) of a validated frame, in one job."""
    row = checked.agg(
        F.count(F.lit(1)).alias("n"), F.sum((F.col(REASON) != "").cast("int")).alias("bad")
    ).first()
    return (int(row["n"]), int(row["bad"] or 0)) if row else (0, 0)


def _to_handoff(
    training: DataFrame,
    pipeline: Pipeline,
    stage: BackfillStage,
    stack: StackConfig,
    state: FeatureState,
    events: TableSource,
    report: StageReport,
    progress: Progress,
) -> None:
    """Commit the stage's rows to its channel, once per set of source snapshots.

    Running again over the same snapshots changes nothing. An incremental read
    (``since_snapshot``) adds a commit; a full read of other snapshots is refused, since it
    would add the rows already there a second time.
    """
    channel = channel_for(stack, pipeline, stage.channel)
    report.table = channel.folder.uri
    positions = dict(report.lineage)
    ids = channel.commit_ids() if channel.exists() else []
    for batch_id in ids:
        earlier = channel.commit(batch_id)
        if earlier.source_positions == positions:
            report.training_rows = earlier.rows
            report.positives = int(earlier.stats.get("positives", 0))
            progress(f"{stage.name}: batch {batch_id} of {channel.name} already holds these rows")
            return
    incremental = isinstance(events, IcebergSource) and events.since_snapshot is not None
    if ids and not incremental:
        raise ConfigError(
            f"channel {channel.name!r} in {channel.root} already holds a backfill of other "
            f"snapshots ({channel.commit(ids[-1]).source_positions}); a full backfill would add "
            "those rows again. Read incrementally (IcebergSource(since_snapshot=...)), or write "
            "to a new channel or handoff location"
        )
    batch_id = ids[-1] + 1 if ids else 0
    training = training.persist()
    positives = training.agg(F.sum("label")).first()
    count = int(positives[0]) if positives is not None and positives[0] is not None else 0
    options = export_options(pipeline, stage.features, state, events.event_time, seed=batch_id)
    commit = export(
        training,
        channel,
        batch_id,
        options=options,
        writer=f"{pipeline.name}.{stage.name}",
        source_positions=positions,
        stats={"positives": count},
        progress=progress,
    )
    training.unpersist()
    # A backfill is complete once committed: followers (a trainer reading the history before
    # the live channel) end here rather than wait. Its next run reopens the channel.
    channel.close()
    if commit is not None:
        report.training_rows = commit.rows
        report.positives = count


def run_backfill(
    spark: SparkSession,
    pipeline: Pipeline,
    stage: BackfillStage,
    stack: StackConfig,
    *,
    feature_state: str | None = None,
    progress: Progress = lambda _: None,
) -> tuple[StageReport, FeatureState]:
    started = time.monotonic()
    spec = stage.features
    report = StageReport(pipeline.name, stage.name, "backfill", stage.channel)
    events_source = _table_source(pipeline, stage.events)
    read = read_table(spark, stack, events_source)
    report.lineage[f"{stage.events}.snapshot_id"] = read.snapshot_id
    checked = validate_table(read.df, events_source.fields, stage.events).persist()
    events, dead_events = split(checked, events_source.fields)
    dead: list[DataFrame] = [dead_events]
    report.events_input, report.events_dead = _counts(checked)
    progress(f"{stage.name}: read {report.events_input:,} {stage.events} rows from {read.table}")

    rows = events
    label_checked = None
    if stage.label is not None:
        label_source = _table_source(pipeline, stage.label.source)
        label_read = read_table(spark, stack, label_source)
        report.lineage[f"{stage.label.source}.snapshot_id"] = label_read.snapshot_id
        label_checked = validate_table(
            label_read.df, label_source.fields, stage.label.source
        ).persist()
        labels, dead_labels = split(label_checked, label_source.fields)
        dead.append(dead_labels)
        report.labels_input, report.labels_dead = _counts(label_checked)
        rows = label_batch(
            rows,
            labels,
            stage.label,
            _event_time(events_source, stage.events),
            _event_time(label_source, stage.label.source),
        )

    for spec_enrich in stage.enrich:
        dimension = read_table(spark, stack, _table_source(pipeline, spec_enrich.source))
        report.lineage[f"{spec_enrich.source}.snapshot_id"] = dimension.snapshot_id
        rows = enrich(rows, dimension.df, spec_enrich)

    usable, unusable = split_unusable(rows, spec, stage.events)
    usable = usable.persist()
    unusable_count = unusable.count()
    report.events_dead += unusable_count
    dead.append(unusable)

    states = states_location(stack, pipeline.namespace)
    # A named feature state wins over fitting: an incremental retrain keeps the champion's
    # layout (a refit could change vocabulary sizes, and with them the model's tables).
    if stage.fit and feature_state is None:
        state = fit_state(
            usable, spec, {"pipeline": pipeline.name, "stage": stage.name, **report.lineage}
        )
        saved = state.save(states)
        progress(f"{stage.name}: fitted feature state {state.version} -> {saved}")
    else:
        state = FeatureState.load(states, spec, feature_state)
    report.feature_state = state.version

    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {stack.catalog.name}.{pipeline.namespace}")
    training = training_rows(usable, spec, state)
    if isinstance(pipeline.output, HandoffOutput):
        _to_handoff(training, pipeline, stage, stack, state, events_source, report, progress)
    else:
        table = training_table(stack, pipeline, stage.channel)
        report.table = table
        training.writeTo(table).using("iceberg").createOrReplace()
        written = (
            spark.table(table)
            .agg(F.count(F.lit(1)).alias("n"), F.sum("label").alias("positives"))
            .first()
        )
        report.training_rows = int(written["n"]) if written else 0
        report.positives = int(written["positives"] or 0) if written else 0

    dead_table = dead_letter_table(stack, pipeline)
    ensure_table(spark, dead_table, DEAD_LETTER_SCHEMA, "stage")
    all_dead = dead_letter_rows(reduce(DataFrame.unionByName, dead), pipeline.name, stage.name)
    # A rerun replaces this stage's dead letters instead of adding a second copy.
    all_dead.writeTo(dead_table).overwrite(
        (F.col("pipeline") == pipeline.name) & (F.col("stage") == stage.name)
    )
    for frame in (checked, label_checked, usable):
        if frame is not None:
            frame.unpersist()
    report.batches = 1
    report.seconds = time.monotonic() - started
    progress(
        f"{stage.name}: {report.training_rows:,} training rows, "
        f"{report.events_dead:,} dead letters -> {report.table}"
    )
    return report, state
