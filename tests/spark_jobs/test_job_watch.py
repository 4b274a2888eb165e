"""The moments of a running job that a micro-batch's writer waits on
(spark_jobs.live.job_watch)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from pyspark import inheritable_thread_target
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_jobs.jvm import set_job_group, set_local_property
from spark_jobs.live.job_watch import JobWatch, cache_loaded, wait_until


def test_waiting_ends_when_ready_or_when_stopped() -> None:
    stop = threading.Event()
    calls = iter([False, False, True])
    assert wait_until(lambda: next(calls), stop=stop, poll_s=0.001)

    threading.Timer(0.05, stop.set).start()
    assert not wait_until(lambda: False, stop=stop, poll_s=0.001)
    # Stopped already: asked once more, not waited on.
    assert wait_until(lambda: True, stop=stop)


@pytest.fixture
def job_group(spark: SparkSession) -> Iterator[None]:
    set_job_group(spark, "job-watch-test", "a batch's jobs")
    yield
    set_local_property(spark, "spark.jobGroup.id", None)
    set_local_property(spark, "spark.job.description", None)


@pytest.mark.integration
@pytest.mark.usefixtures("job_group")
def test_a_shuffling_job_is_seen_once_submitted_and_the_cache_once_filled(
    spark: SparkSession,
) -> None:
    spark.range(10).collect()  # one stage, before the watch: seen by neither check
    cached = (
        spark.range(0, 200_000, numPartitions=4)
        .withColumn("slow", F.expr("aggregate(sequence(1, 200), 0L, (a, b) -> a + b)"))
        .persist()
    )
    jobs = JobWatch(spark)
    loaded = cache_loaded(cached)
    assert not jobs.staged_job_submitted()
    spark.range(10).collect()  # one stage, after it: a broadcast's kind of job, not counted
    assert not jobs.staged_job_submitted()
    assert not loaded()

    done = threading.Event()
    counts: list[int] = []

    def count() -> None:
        try:
            counts.append(cached.groupBy((F.col("id") % 7).alias("k")).count().count())
        finally:
            done.set()

    worker = threading.Thread(target=inheritable_thread_target(spark)(count))
    worker.start()
    try:
        assert wait_until(jobs.staged_job_submitted, stop=done)
        assert wait_until(loaded, stop=done)
    finally:
        worker.join()
        cached.unpersist()
    assert counts == [7]


@pytest.mark.integration
def test_a_frame_that_is_not_cached_is_never_loaded(spark: SparkSession) -> None:
    assert not cache_loaded(spark.range(5))()
