"""What a backfill and a live stage run share: their context, and the phases both go through.

Both stages read sources, validate them into rows and dead letters, label, enrich, featurize
with a feature state, write training rows and dead letters, and report counts that reconcile.
The *order* in which they do it differs: a backfill runs each phase once over the whole input,
while a live stage wires the phases into one streaming query and runs enrichment, featurization
and writing per micro-batch, inside the query's plan or its ``foreachBatch`` (spark_jobs.live).
So this is a base class holding the shared context and the shared phases, not a template
method with one fixed ``run()``: each stage's ``run()`` lists its own phases top to bottom, as
torchtitan's trainer does, and a change to one stage's order (supervised restarts, one query
instead of two) does not have to fit the other's. The phases a micro-batch writer needs too
(enrichment, counting) are plain functions here, since a writer holds no run.

Before either reads anything, :meth:`StageRun.check_outputs` writes a probe file to every
location the stage will write (:func:`flow.pipeline.outputs.stage_outputs`, engine-neutral so
that ``flow run`` probes them before it starts a driver): an unwritable handoff is found in a
second, with the setting to change, not after an hour of fitting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, Literal, TypeVar

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.pipeline.model import BackfillStage, Enrich, LiveStage, Pipeline, Stage
from flow.pipeline.outputs import check_outputs, stage_outputs
from flow.pipeline.state import FeatureState, states_location
from flow.storage import Location
from spark_jobs.joins import enrich
from spark_jobs.report import StageReport
from spark_jobs.rows import dead_letter_table
from spark_jobs.sinks import (
    DEAD_LETTER_SCHEMA,
    LEDGER_PROPERTIES,
    dead_letter_rows,
    ensure_table,
)
from spark_jobs.validate import REASON

__all__ = [
    "Progress",
    "StageRun",
    "check_derived",
    "check_outputs",
    "enriched",
    "input_counts",
    "positives",
    "stage_outputs",
]

Progress = Callable[[str], None]
S = TypeVar("S", BackfillStage, LiveStage)


def input_counts() -> list[Column]:
    """Aggregates of validated records: how many (``n``), and how many invalid (``bad``)."""
    return [
        F.count(F.lit(1)).alias("n"),
        F.sum((F.col(REASON) != "").cast("int")).alias("bad"),
    ]


def positives(training: DataFrame) -> int:
    """The positive labels among training rows (one Spark job)."""
    found = training.agg(F.sum("label")).first()
    return int(found[0]) if found is not None and found[0] is not None else 0


def enriched(rows: DataFrame, stage: Stage, side: Callable[[Enrich], DataFrame]) -> DataFrame:
    """``rows`` joined with each of the stage's dimension tables in turn, then its
    :class:`~flow.pipeline.model.Derived` columns, in order. ``side`` gives an enrichment's
    dimension as joined (spark_jobs.joins.dimension_side): a backfill reads it once and records
    its snapshot, a stream keeps it cached until the table changes."""
    for spec in stage.enrich:
        rows = enrich(rows, side(spec), spec)
    for derived in stage.derive:
        rows = rows.withColumn(derived.name, F.expr(derived.sql).cast(derived.type))
    return rows


def check_derived(spark: SparkSession, pipeline: Pipeline, stage: Stage) -> None:
    """Resolve the stage's Derived expressions against its declared columns, on an empty frame:
    a ConfigError with Spark's reason, before the stage reads anything."""
    if not stage.derive:
        return
    made = {d.name for d in stage.derive}
    declared = [f for name, f in pipeline.columns[stage.name].items() if name not in made]
    schema = ", ".join(f"`{f.name}` {f.type}" for f in declared)
    frame = spark.createDataFrame([], schema)
    for derived in stage.derive:
        try:
            frame = frame.withColumn(derived.name, F.expr(derived.sql).cast(derived.type))
        except AnalysisException as exc:  # a ParseException is one too
            reason = str(exc).strip().splitlines()[0]
            raise ConfigError(
                f"stage {stage.name!r}: Derived({derived.name!r}, {derived.sql!r}) does not "
                f"work on its columns ({', '.join(frame.columns)}): {reason}"
            ) from None


class StageRun(Generic[S]):
    """One run of one stage: its inputs, its report, its clock and the phases stages share."""

    def __init__(
        self,
        spark: SparkSession,
        stack: StackConfig,
        pipeline: Pipeline,
        stage: S,
        kind: Literal["backfill", "live"],
        progress: Progress,
    ) -> None:
        self.started = time.monotonic()
        self.spark, self.stack, self.pipeline = spark, stack, pipeline
        self.stage: S = stage
        self.progress = progress
        self.report = StageReport(pipeline.name, stage.name, kind, stage.channel)

    def check_outputs(self, *, fits: bool = False) -> None:
        """Fail now, naming what to change, if the stage could not write its outputs at the end
        or could not compute its Derived columns."""
        check_derived(self.spark, self.pipeline, self.stage)
        check_outputs(self.stack, self.pipeline, self.stage, fits=fits)

    @property
    def states(self) -> Location:
        """Where the pipeline's fitted feature states live."""
        return states_location(self.stack, self.pipeline.namespace)

    def load_state(self, version: str | None) -> FeatureState:
        """The fitted state ``version`` of the stage's spec (None: the latest), said in one
        line: which one a stage that does not fit uses is never a guess."""
        state = FeatureState.load(self.states, self.stage.features, version)
        self.report.feature_state = state.version
        fitted = state.fitted_on
        chosen = "as named" if version else "LATEST"
        self.progress(
            f"{self.stage.name}: feature state {state.version} ({chosen}; fitted "
            f"{fitted.get('fitted_at', '?')} by stage {fitted.get('stage', '?')!r} of "
            f"{fitted.get('pipeline', '?')!r})"
        )
        return state

    def ensure_namespace(self) -> None:
        catalog = self.stack.catalog.name
        self.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {catalog}.{self.pipeline.namespace}")

    def open_dead_letters(self) -> str:
        """The pipeline's dead-letter table, created if missing."""
        table = dead_letter_table(self.stack, self.pipeline)
        ensure_table(self.spark, table, DEAD_LETTER_SCHEMA, "stage", LEDGER_PROPERTIES)
        return table

    def dead_letters(self, dead: DataFrame) -> DataFrame:
        """Invalid or unusable records as this stage's rows of the dead-letter table."""
        return dead_letter_rows(dead, self.pipeline.name, self.stage.name)

    def finish(self, summary: str) -> StageReport:
        """Stop the clock and say what the stage did."""
        self.report.seconds = time.monotonic() - self.started
        self.progress(summary)
        return self.report
