"""A backfill stage: table history, validated, labelled, enriched, fitted, featurized, written.

The stage replaces its channel's training rows (a backfill recomputes the history it covers)
and its own earlier dead letters, so running it twice gives the same tables, not twice the rows.

A state it fits is saved under its version as soon as it is fitted (the channel's commit names
that version), but becomes the spec's LATEST only once the stage's rows and dead letters are
written: a stage that fails after fitting leaves LATEST on the last good state, which is what
live stages and trainers then load.
"""

from __future__ import annotations

from functools import reduce
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from flow.config import StackConfig
from flow.errors import ConfigError, DeadLetterBudgetError
from flow.handoff import Channel
from flow.pipeline.labels import SAMPLE_ROWS, label_sample
from flow.pipeline.model import BackfillStage, Enrich, HandoffOutput, LabelJoin, Pipeline
from flow.pipeline.sources import PRODUCED_AT, DeltaSource, IcebergSource, TableSource
from flow.pipeline.state import FeatureState
from flow.transform import FeatureTransform
from flow.transform.serving import EXAMPLE_ROWS
from spark_jobs.features import fit_state, training_rows
from spark_jobs.handoff import export
from spark_jobs.history import context_sources, with_history
from spark_jobs.joins import dimension_side, label_batch
from spark_jobs.jvm import plan_size_bytes
from spark_jobs.partitions import shuffle_partitions
from spark_jobs.report import StageReport
from spark_jobs.rows import (
    channel_for,
    export_options,
    missing,
    serving_features,
    split_unusable,
    training_table,
    unusable_reason,
)
from spark_jobs.sources import read_table
from spark_jobs.stage import Progress, StageRun, enriched, input_counts
from spark_jobs.validate import split, validate_table

__all__ = ["run_backfill"]


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
    row = checked.agg(*input_counts()).first()
    return (int(row["n"]), int(row["bad"] or 0)) if row else (0, 0)


class BackfillRun(StageRun[BackfillStage]):
    """One backfill: each phase runs once over the whole input, in the order ``run`` lists.

    Phases add to ``dead`` (frames of dead letters, written together at the end) and ``cached``
    (frames persisted for more than one job, released at the end).
    """

    def __init__(
        self,
        spark: SparkSession,
        pipeline: Pipeline,
        stage: BackfillStage,
        stack: StackConfig,
        state_version: str | None,
        progress: Progress,
    ) -> None:
        super().__init__(spark, stack, pipeline, stage, "backfill", progress)
        self.state_version = state_version
        self.events = _table_source(pipeline, stage.events)
        self.dead: list[DataFrame] = []
        self.cached: list[DataFrame] = []

    @property
    def fits(self) -> bool:
        """Whether this run fits the feature state (rather than loading a saved one)."""
        # A named feature state wins over fitting: an incremental retrain keeps the champion's
        # layout (a refit could change vocabulary sizes, and with them the model's tables).
        return self.stage.fit and self.state_version is None

    def run(self) -> tuple[StageReport, FeatureState]:
        self.check_outputs(fits=self.fits)
        rows = self.read_events()
        self._size_shuffles(rows)
        if self.stage.label is not None:
            rows = self.label(rows, self.stage.label)
        usable = self.usable(enriched(rows, self.stage, self.dimension))
        self._check_dead_share()
        state = self.fit_or_load(usable)
        self.ensure_namespace()
        training = training_rows(usable, self.stage.features, state)
        if isinstance(self.pipeline.output, HandoffOutput):
            self.to_handoff(training, state, usable)
        else:
            self.to_table(training)
        self.write_dead_letters()
        if self.fits:
            state.make_latest(self.states)
        for frame in self.cached:
            frame.unpersist()
        self.report.batches = 1
        report = self.finish(
            f"{self.stage.name}: {self.report.training_rows:,} training rows, "
            f"{self.report.events_dead:,} dead letters -> {self.report.table}"
            f"{self.report.said_missing()}"
        )
        return report, state

    def _size_shuffles(self, rows: DataFrame) -> None:
        """Shuffle partitions by the cluster's cores and the events' size, unless given
        (spark_jobs.partitions: Spark's 200 made a cluster backfill 2.5x slower)."""
        partitions = shuffle_partitions(self.spark, input_bytes=plan_size_bytes(rows))
        if partitions is not None:
            self.spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
            self.progress(f"{self.stage.name}: {partitions} shuffle partitions")

    def _validated(
        self, df: DataFrame, source: TableSource, name: str
    ) -> tuple[DataFrame, int, int]:
        """A source's valid rows, and (rows, invalid rows); the invalid ones become dead letters."""
        checked = validate_table(df, source.fields, name).persist()
        self.cached.append(checked)
        valid, dead = split(checked, source.fields)
        self.dead.append(dead)
        return (valid, *_counts(checked))

    def read_events(self) -> DataFrame:
        read = read_table(self.spark, self.stack, self.events)
        self.report.lineage[f"{self.stage.events}.snapshot_id"] = read.snapshot_id
        self._check_label_sample(read.df)
        rows, self.report.events_input, self.report.events_dead = self._validated(
            read.df, self.events, self.stage.events
        )
        if PRODUCED_AT not in rows.columns:  # a table row has no production time of its own
            rows = rows.withColumn(PRODUCED_AT, F.lit(None).cast("timestamp"))
        self.progress(
            f"{self.stage.name}: read {self.report.events_input:,} {self.stage.events} rows "
            f"from {read.table}"
        )
        return self._with_history(rows, read.snapshot_id)

    def _with_history(self, rows: DataFrame, snapshot: int | None) -> DataFrame:
        """The events with the stage's History columns; the valid rows before a partial read
        are their context (spark_jobs.history), read but neither counted nor dead letters."""
        if not self.stage.history:
            return rows
        parts = [
            split(
                validate_table(read_table(self.spark, self.stack, part).df, part.fields, ""),
                part.fields,
            )[0]
            for part in context_sources(self.events, snapshot)
        ]
        context = reduce(DataFrame.unionByName, parts) if parts else None
        event_time = _event_time(self.events, self.stage.events)
        return with_history(rows, self.stage.history, event_time, context)

    def _check_label_sample(self, events: DataFrame) -> None:
        """Fail in seconds, before the job over every event, when the label column is read
        from the events as it is and the first rows' labels are mostly ones that cannot train
        (flow.pipeline.labels): the dead-letter bound would stop the stage, but only after that
        job. A label joined or derived is known only after it, and left to the bound."""
        spec, bound = self.stage.features, self.stage.max_dead_share
        derived = {d.name for d in self.stage.derive}
        if (
            bound >= 1.0
            or self.stage.label is not None
            or spec.label in derived
            or spec.label not in events.columns
        ):
            return
        rows = events.select(spec.label).limit(SAMPLE_ROWS).collect()
        sample = label_sample([r[0] for r in rows], spec.labels)
        if sample.share <= bound:
            return
        said = "0 or 1" if spec.labels == "binary" else "in [0, 1]"
        raise DeadLetterBudgetError(
            f"{self.stage.name}: {sample.bad:,} of the first {sample.rows:,} labels of "
            f"{self.stage.events} ({sample.share:.0%}) are not {said}, e.g. "
            f"{spec.label!r} = {sample.example!r}, over the stage's bound of {bound:.0%} of dead "
            "letters. Nothing was written: derive a 0/1 label, e.g. Derived('label', "
            f"'rating >= 4', type='int'), or raise BackfillStage({self.stage.name!r}, "
            "max_dead_share=...)"
        )

    def label(self, events: DataFrame, label: LabelJoin) -> DataFrame:
        """The events with their labels (a batch join over the label source's table)."""
        source = _table_source(self.pipeline, label.source)
        read = read_table(self.spark, self.stack, source)
        self.report.lineage[f"{label.source}.snapshot_id"] = read.snapshot_id
        self.report.lineage["label_strategy"] = "window"  # every label is known in a backfill
        labels, self.report.labels_input, self.report.labels_dead = self._validated(
            read.df, source, label.source
        )
        return label_batch(
            events,
            labels,
            label,
            _event_time(self.events, self.stage.events),
            _event_time(source, label.source),
        )

    def dimension(self, spec: Enrich) -> DataFrame:
        """An enrichment's dimension table, read once, as joined; its snapshot goes into the
        lineage."""
        read = read_table(self.spark, self.stack, _table_source(self.pipeline, spec.source))
        self.report.lineage[f"{spec.source}.snapshot_id"] = read.snapshot_id
        return dimension_side(read.df, spec)

    def usable(self, rows: DataFrame) -> DataFrame:
        """The rows that can become training rows; the rest (label, weight, a dimension key
        not found with ``on_missing="dead_letter"``) are dead. The dead and each enrichment's
        misses are counted in one job.

        The enriched rows are cached, not only the usable ones: the counts, the fit, the export
        and the dead letters all read them, and each read of an uncached frame ran the label
        join and the enrichments again: 37 Spark jobs against 27 on the tests' small lake
        (tests/spark_jobs/test_backfill_jobs.py)."""
        spec, enrichments = self.stage.features, self.stage.enrich
        rows = rows.persist()
        self.cached.append(rows)
        usable, unusable = split_unusable(rows, spec, self.stage.events, enrichments)
        misses = missing(enrichments)
        flags = [unusable_reason(spec, enrichments) != "", *misses.values()]
        counts = rows.agg(*[F.sum(f.cast("int")).alias(f"n{i}") for i, f in enumerate(flags)])
        found = [int(n or 0) for n in (counts.first() or [0] * len(flags))]
        self.report.events_dead += found[0]
        self.report.dimension_misses = dict(zip(misses, found[1:], strict=True))
        self.dead.append(unusable)
        return usable

    def _check_dead_share(self) -> None:
        """Fail before fitting or writing when more of the events are dead letters than the
        stage's ``max_dead_share``: one line with the top reason and an example."""
        total, dead = self.report.events_input, self.report.events_dead
        bound = self.stage.max_dead_share
        if total == 0 or dead / total <= bound:
            return
        reasons = (
            reduce(DataFrame.unionByName, self.dead)
            .groupBy("reason")
            .agg(F.count(F.lit(1)).alias("n"), F.first("raw").alias("example"))
            .orderBy(F.desc("n"))
            .first()
        )
        top = (
            f"; the most common reason: {reasons['reason']} ({reasons['n']:,} rows), e.g. "
            f"{_shown(reasons['example'])}"
            if reasons
            else ""
        )
        raise DeadLetterBudgetError(
            f"{self.stage.name}: {dead:,} of {total:,} {self.stage.events} rows "
            f"({dead / total:.1%}) are dead letters, over the stage's bound of {bound:.0%}{top}. "
            "Nothing was written: fix the input or the spec (a label must be 0/1: derive it, "
            "e.g. Derived('label', 'rating >= 4', type='int')), or raise "
            f"BackfillStage({self.stage.name!r}, max_dead_share=...)"
        )

    def fit_or_load(self, usable: DataFrame) -> FeatureState:
        """The state fitted on ``usable`` and saved by version (LATEST moves at the end of
        :meth:`run`), or the one named or LATEST when this run does not fit."""
        if not self.fits:
            return self.load_state(self.state_version)
        lineage = {"pipeline": self.pipeline.name, "stage": self.stage.name, **self.report.lineage}
        state = fit_state(usable, self.stage.features, lineage)
        saved = state.save(self.states)
        self.progress(f"{self.stage.name}: fitted feature state {state.version} -> {saved}")
        self.report.feature_state = state.version
        return state

    def to_handoff(self, training: DataFrame, state: FeatureState, usable: DataFrame) -> None:
        """Commit the stage's rows to its channel, once per set of source snapshots; a new
        channel records the features with two of ``usable``'s rows as raw examples."""
        channel = channel_for(self.stack, self.pipeline, self.stage.channel)
        self.report.table = channel.folder.uri
        positions = dict(self.report.lineage)
        batch_id = self._next_batch(channel, positions)
        if batch_id is None:
            return
        # Cached by the export's first job and read by its write; the writer tasks count the
        # positives as they write (a job of its own cost 8 jobs under adaptive execution, each
        # ~0.3 s on a cluster: docs/experiments/2026-11-28-cluster-timings.md).
        training = training.persist()
        label = self.stage.label
        options = export_options(
            self.pipeline,
            self.stage,
            state,
            self.events.event_time,
            seed=batch_id,
            labels=label.channel_labels(streaming=False) if label else None,
            count_positives=True,
            features=None if channel.exists() else self._features(state, usable),
        )
        commit = export(
            training,
            channel,
            batch_id,
            options=options,
            writer=f"{self.pipeline.name}.{self.stage.name}",
            source_positions=positions,
            progress=self.progress,
        )
        training.unpersist()
        # A backfill is complete once committed: followers (a trainer reading the history before
        # the live channel) end here rather than wait. Its next run reopens the channel.
        channel.close()
        if commit is not None:
            self.report.training_rows = commit.rows
            self.report.positives = int(commit.stats.get("positives", 0))

    def _features(self, state: FeatureState, usable: DataFrame) -> dict[str, object]:
        """What the new channel records of its features, with two raw rows as examples: rows
        without nulls where there are such (a served model's input example, which MLflow types
        by its values), read from ``usable`` (cached; filled by the fit where the stage fits)."""
        inputs = FeatureTransform(self.stage.features, state).inputs
        rows = usable.select(*inputs)
        example = rows.dropna().limit(EXAMPLE_ROWS).toArrow()
        if example.num_rows == 0:
            example = rows.limit(EXAMPLE_ROWS).toArrow()
        return serving_features(self.pipeline, self.stage, state, example)

    def _next_batch(self, channel: Channel, positions: dict[str, Any]) -> int | None:
        """The batch id to commit these snapshots as; None if a commit of them exists already.

        Running again over the same snapshots changes nothing (the report takes the earlier
        commit's counts). An incremental read (``since_snapshot``) adds a commit; a full read of
        other snapshots is refused, since it would add the rows already there a second time.
        """
        ids = channel.commit_ids() if channel.exists() else []
        for batch_id in ids:
            earlier = channel.commit(batch_id)
            if earlier.source_positions == positions:
                self.report.training_rows = earlier.rows
                self.report.positives = int(earlier.stats.get("positives", 0))
                self.progress(
                    f"{self.stage.name}: batch {batch_id} of {channel.name} already holds "
                    "these rows"
                )
                return None
        incremental = (
            isinstance(self.events, IcebergSource) and self.events.since_snapshot is not None
        )
        if ids and not incremental:
            raise ConfigError(
                f"channel {channel.name!r} in {channel.root} already holds a backfill of other "
                f"snapshots ({channel.commit(ids[-1]).source_positions}); a full backfill would "
                "add those rows again. Read incrementally (IcebergSource(since_snapshot=...)), or "
                "write to a new channel or handoff location"
            )
        return ids[-1] + 1 if ids else 0

    def to_table(self, training: DataFrame) -> None:
        """Replace the channel's Iceberg table with the stage's rows."""
        table = training_table(self.stack, self.pipeline, self.stage.channel)
        self.report.table = table
        training.writeTo(table).using("iceberg").createOrReplace()
        written = (
            self.spark.table(table)
            .agg(F.count(F.lit(1)).alias("n"), F.sum("label").alias("positives"))
            .first()
        )
        self.report.training_rows = int(written["n"]) if written else 0
        self.report.positives = int(written["positives"] or 0) if written else 0

    def write_dead_letters(self) -> None:
        table = self.open_dead_letters()
        rows = self.dead_letters(reduce(DataFrame.unionByName, self.dead))
        # A rerun replaces this stage's dead letters instead of adding a second copy.
        rows.writeTo(table).overwrite(
            (F.col("pipeline") == self.pipeline.name) & (F.col("stage") == self.stage.name)
        )


def _shown(raw: bytes | bytearray | None, limit: int = 160) -> str:
    """A dead letter's raw row, short enough for one line."""
    text = bytes(raw).decode("utf-8", "replace") if raw is not None else "(no row)"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_backfill(
    spark: SparkSession,
    pipeline: Pipeline,
    stage: BackfillStage,
    stack: StackConfig,
    *,
    feature_state: str | None = None,
    progress: Progress = lambda _: None,
) -> tuple[StageReport, FeatureState]:
    """Run the stage once over its tables; ``feature_state`` names a state to use, not fit."""
    return BackfillRun(spark, pipeline, stage, stack, feature_state, progress).run()
