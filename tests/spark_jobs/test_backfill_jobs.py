"""How many Spark jobs a backfill runs: each costs a cluster ~0.3 s more than a local run
(docs/experiments/2026-11-28-cluster-timings.md), and a job that recomputes a frame costs its
rows again too. A refactor that stops caching a frame read by several phases shows here as ~10
more jobs, long before anyone measures a cluster."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from flow.pipeline import BackfillStage
from spark_jobs.backfill import run_backfill
from spark_jobs.jvm import status_tracker
from tests.spark_jobs.test_stages import Lake

pytestmark = pytest.mark.integration

MOST_JOBS = 32
"""The backfill below ran 27 jobs when this was written (Spark 4.1.3), 37 before its enriched
rows were cached; the rest is room for a Spark upgrade's changes to adaptive execution."""


def test_a_backfill_computes_its_label_join_and_enrichment_once(
    spark: SparkSession, lake: Lake
) -> None:
    pipeline = lake.pipeline()
    stage = pipeline.stage("backfill", BackfillStage)
    assert stage.label is not None
    assert stage.enrich  # the frames a second pass would recompute
    tracker = status_tracker(spark)
    before = set(tracker.getJobIdsForGroup(None))
    report, _ = run_backfill(spark, pipeline, stage, lake.stack)
    jobs = set(tracker.getJobIdsForGroup(None)) - before
    assert report.training_rows == 60  # every phase ran: counts, fit, export, dead letters
    assert len(jobs) <= MOST_JOBS, (
        f"the backfill ran {len(jobs)} Spark jobs, over {MOST_JOBS}: does a phase recompute the "
        "label join and enrichments? (BackfillRun.usable caches the enriched rows that the "
        "counts, the fit, the export and the dead letters read)"
    )
