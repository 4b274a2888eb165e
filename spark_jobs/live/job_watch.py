"""What a micro-batch's own Spark jobs are doing, read on the driver while they run.

A live stage's writer (spark_jobs.live.stream_writer) runs its counts job first: that job runs
the stateful operators and fills the batch's cache. Its other work waits on two moments of that
job, not on its end: the planning of the writes starts once the job is submitted (so that it
does not compete with Spark planning that job), and the export's job once every partition of
the cache is stored (the export then reads the cache while the counts job finishes its
aggregation, instead of starting after it). Both are polled: Spark tells Python of neither.

Why not submit the export at once: a job that reaches a partition of the cache before the counts
job does computes it, the stateful operators with it, and their metrics (the duplicates they
dropped, spark_jobs.live.batch_facts) would then come in after the counts job is done.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession

from spark_jobs.jvm import cache_builder, local_property, status_tracker

__all__ = ["JobWatch", "cache_loaded", "wait_until"]

_GROUP = "spark.jobGroup.id"


def wait_until(ready: Callable[[], bool], *, stop: threading.Event, poll_s: float = 0.02) -> bool:
    """Whether ``ready()`` came true before ``stop`` was set; waits for one or the other (``stop``
    is set when the job waited on ends, so this never outwaits it)."""
    while not stop.is_set():
        if ready():
            return True
        stop.wait(poll_s)
    return ready()


class JobWatch:
    """Tells when a job of more than one stage was submitted after this watch was made, among the
    jobs of the calling thread's job group (a streaming query's run: Structured Streaming sets
    one for all of a query's jobs; the broadcasts a query's planning runs are jobs of one stage)."""

    def __init__(self, spark: SparkSession) -> None:
        self._tracker = status_tracker(spark)
        self._group = local_property(spark, _GROUP)
        self._before = max(self._ids(), default=-1)

    def _ids(self) -> list[int]:
        if self._group is None:
            return list(self._tracker.getActiveJobsIds())
        return list(self._tracker.getJobIdsForGroup(self._group))

    def staged_job_submitted(self) -> bool:
        for job in self._ids():
            if job > self._before:
                info = self._tracker.getJobInfo(job)
                if info is not None and len(info.stageIds) > 1:
                    return True
        return False


def cache_loaded(persisted: DataFrame) -> Callable[[], bool]:
    """Whether every partition of ``persisted`` (a persisted DataFrame) is stored in the cache,
    asked of Spark's block manager; a frame that is not cached never says so."""
    builder = cache_builder(persisted)
    if builder is None:  # not cached: nothing to wait for but the job itself
        return lambda: False
    return lambda: bool(builder.isCachedColumnBuffersLoaded())
