"""Each accessor of Spark's private API (spark_jobs.jvm) against the running Spark.

A Spark upgrade that renames or changes what an accessor reaches fails here, by the accessor's
name and the Spark version, before it fails somewhere in a live stage.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyspark
import pytest
from pyspark import SparkContext, TaskContext
from pyspark.errors import AnalysisException, PythonException, StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs import jvm
from spark_jobs.live.job_watch import wait_until


@contextmanager
def accessor(name: str) -> Iterator[None]:
    """Any failure within is reported as ``spark_jobs.jvm.<name>``'s on this Spark."""
    try:
        yield
    except Exception as exc:
        pytest.fail(
            f"spark_jobs.jvm.{name} does not work on Spark {pyspark.__version__}: "
            f"{type(exc).__name__}: {exc}\nThe private API it reaches changed: update it there "
            "(its docstring says what it reaches).",
            pytrace=False,
        )


def _grouped(spark: SparkSession, df: DataFrame) -> DataFrame:
    return df.groupBy((F.col("id") % 3).alias("k")).count()


@pytest.mark.integration
def test_start_driver_jvm_gives_the_running_jvm(spark: SparkSession) -> None:
    with accessor("start_driver_jvm"):
        view = jvm.start_driver_jvm()
        assert view.org.apache.spark.util.Utils.classIsLoadable("org.apache.spark.SparkContext")


@pytest.mark.integration
def test_hadoop_conf_gives_the_configuration_spark_opens_files_with(spark: SparkSession) -> None:
    with accessor("hadoop_conf"):
        conf = jvm.hadoop_conf(spark)
        assert conf.getClass().getName() == "org.apache.hadoop.conf.Configuration"
        assert conf.get("fs.file.impl") == "flow.spark.ForklessLocalFileSystem"


@pytest.mark.integration
def test_jvm_gives_spark_and_the_connectors_classes(spark: SparkSession) -> None:
    with accessor("jvm"):
        utils = jvm.jvm(spark).org.apache.spark.util.Utils
        assert utils.classIsLoadable("org.apache.iceberg.spark.SparkCatalog")


@pytest.mark.integration
def test_standalone_jvm_parses_a_trigger_without_a_session() -> None:
    with accessor("standalone_jvm"), jvm.standalone_jvm() as view:
        trigger = view.org.apache.spark.sql.streaming.Trigger.ProcessingTime("2 seconds")
        assert int(trigger.intervalMs()) == 2000


@pytest.mark.integration
def test_driver_memory_after_a_collection_is_what_is_held(spark: SparkSession) -> None:
    mb = 2**20
    with accessor("driver_memory"):
        builder = jvm.jvm(spark).java.lang.StringBuilder
        before = jvm.driver_memory(spark, collect=True)
        held = builder(96 * mb)  # a 96 MB array, held while its proxy lives
        for _ in range(4):  # twice as much again, garbage once py4j lets go of its proxies
            builder(48 * mb).capacity()
        deadline = time.monotonic() + 30  # py4j releases dropped proxies on a thread of its own
        after = jvm.driver_memory(spark, collect=True)
        while after.heap_used > before.heap_used + 160 * mb and time.monotonic() < deadline:
            time.sleep(0.5)
            after = jvm.driver_memory(spark, collect=True)
        assert 0 < after.heap_used <= after.heap_committed <= after.heap_max
        assert before.heap_used + 80 * mb < after.heap_used < before.heap_used + 160 * mb
        assert held.capacity() == 96 * mb
        assert after.non_heap_used > 0
        if Path("/proc/self").exists():  # Linux: the pid is the JVM's, its RSS readable
            assert "java" in Path(f"/proc/{after.pid}/cmdline").read_text()


@pytest.mark.integration
def test_launch_conf_holds_what_the_driver_was_launched_with(spark: SparkSession) -> None:
    with accessor("launch_conf"):
        conf = jvm.launch_conf(spark)
        # Whichever test made the shared context named it: the launch conf says the same.
        assert conf.get("spark.app.name") == spark.conf.get("spark.app.name")
        assert conf.contains("spark.master")
        assert not conf.contains("spark.flow.never.set")


@pytest.mark.integration
def test_default_parallelism_is_what_a_range_is_cut_into(spark: SparkSession) -> None:
    with accessor("default_parallelism"):
        cores = jvm.default_parallelism(spark)
        assert isinstance(cores, int)
        assert cores >= 1
        assert spark.range(100).rdd.getNumPartitions() == cores


@pytest.mark.integration
def test_plan_size_bytes_estimates_a_frame_without_running_it(spark: SparkSession) -> None:
    with accessor("plan_size_bytes"):
        small = jvm.plan_size_bytes(spark.range(1_000))
        large = jvm.plan_size_bytes(spark.range(1_000_000))
        assert small is not None
        assert large is not None
        assert 0 < small < large


@pytest.mark.integration
def test_job_group_local_properties_and_the_status_tracker(spark: SparkSession) -> None:
    group = f"jvm-test-{uuid.uuid4().hex[:8]}"
    with accessor("set_job_group / local_property / status_tracker"):
        jvm.set_job_group(spark, group, "a test's jobs")
        try:
            assert jvm.local_property(spark, "spark.jobGroup.id") == group
            _grouped(spark, spark.range(20, numPartitions=2)).collect()
            tracker = jvm.status_tracker(spark)
            jobs = list(tracker.getJobIdsForGroup(group))
            assert jobs
            infos = [tracker.getJobInfo(j) for j in jobs]
            assert any(info is not None and len(info.stageIds) > 1 for info in infos)
        finally:
            jvm.set_local_property(spark, "spark.jobGroup.id", None)
            jvm.set_local_property(spark, "spark.job.description", None)
        assert jvm.local_property(spark, "spark.jobGroup.id") is None


@pytest.mark.integration
def test_set_local_property_reaches_the_tasks(spark: SparkSession) -> None:
    key = "flow.test.batch"

    def said(_: object) -> str | None:
        context = TaskContext.get()
        return context.getLocalProperty(key) if context is not None else "no task"

    with accessor("set_local_property"):
        jvm.set_local_property(spark, key, "7")
        try:
            assert spark.range(1).rdd.map(said).collect() == ["7"]
        finally:
            jvm.set_local_property(spark, key, None)
        assert spark.range(1).rdd.map(said).collect() == [None]


@pytest.mark.integration
def test_cancel_all_jobs_ends_a_running_job(spark: SparkSession) -> None:
    failed: list[BaseException] = []

    def endless() -> None:
        try:
            spark.range(0, 10**13, numPartitions=2).selectExpr("sum(id)").collect()
        except Exception as exc:
            failed.append(exc)

    stop = threading.Event()
    with accessor("cancel_all_jobs"):
        runner = threading.Thread(target=endless, daemon=True)
        tracker = jvm.status_tracker(spark)
        runner.start()
        assert wait_until(lambda: bool(list(tracker.getActiveJobsIds())), stop=stop, poll_s=0.05)
        jvm.cancel_all_jobs(spark)
        runner.join(timeout=300)
        assert not runner.is_alive()
        assert failed
        assert "cancel" in str(failed[0]).lower()


@pytest.mark.integration
def test_context_stopped_and_context_stop_replaced(spark: SparkSession) -> None:
    calls: list[str] = []
    with accessor("context_stopped / context_stop_replaced"):
        assert jvm.context_stopped(spark) is False
        with jvm.context_stop_replaced(spark, lambda *_, **__: calls.append("stop")):
            SparkContext.getOrCreate().stop()  # what a job's script may call
        assert calls == ["stop"]
        assert jvm.context_stopped(spark) is False
        assert "stop" not in vars(SparkContext.getOrCreate())  # the method is the class's again


@pytest.mark.integration
def test_make_current_in_python_and_in_the_jvm(spark: SparkSession) -> None:
    other = spark.newSession()
    other.conf.set("flow.test.session", "other")
    active = jvm.jvm(spark).org.apache.spark.sql.SparkSession.active
    with accessor("make_current"):
        try:
            jvm.make_current(other)
            assert SparkSession.getActiveSession() is other
            assert SparkSession.builder.getOrCreate() is other
            assert active().conf().get("flow.test.session", "") == "other"
        finally:
            jvm.make_current(spark)
        assert SparkSession.getActiveSession() is spark
        assert active().conf().get("flow.test.session", "") == ""


@pytest.mark.integration
def test_executed_plan_is_the_physical_plan_the_callers_walk(spark: SparkSession) -> None:
    with accessor("executed_plan"):
        # No exchange, so no adaptive plan around it (a micro-batch's plans are not adaptive).
        plan = jvm.executed_plan(spark.range(10).where("id > 3"))
        plan.prepare()
        assert "Filter" in str(plan.toString())
        children = plan.children()
        assert children.size() == 1
        assert children.apply(0).metrics().contains("numOutputRows")


@pytest.mark.integration
def test_codegen_text_and_classes_compiled(spark: SparkSession) -> None:
    literal = uuid.uuid4().int % 10**9  # written into the generated code: a class never seen
    df = spark.range(4).select((F.col("id") * literal + 1).alias("x"))
    with accessor("codegen_text"):
        text = jvm.codegen_text(df)
        assert "maxMethodCodeSize" in text
        assert f"{literal}L" in text
    with accessor("classes_compiled"):
        before = jvm.classes_compiled(spark)
        df.collect()
        assert jvm.classes_compiled(spark) > before


@pytest.mark.integration
def test_cache_builder_says_when_a_cache_is_filled(spark: SparkSession) -> None:
    with accessor("cache_builder"):
        assert jvm.cache_builder(spark.range(3)) is None
        cached = spark.range(0, 1000, numPartitions=2).persist()
        try:
            builder = jvm.cache_builder(cached)
            assert builder is not None
            assert not builder.isCachedColumnBuffersLoaded()
            cached.count()
            assert builder.isCachedColumnBuffersLoaded()
        finally:
            cached.unpersist()


@pytest.mark.integration
def test_last_execution_is_the_running_batch_with_its_metrics(
    spark: SparkSession, tmp_path: Path
) -> None:
    spark.range(5).write.parquet(str(tmp_path / "in"))
    name = f"jvm_test_{uuid.uuid4().hex[:8]}"
    seen: dict[str, object] = {}

    def batch(df: DataFrame, _: int) -> None:
        df.count()
        query = next(q for q in spark.streams.active if q.name == name)
        with accessor("last_execution"):
            execution = jvm.last_execution(query)
            seen["observed"] = bool(execution.observedMetrics().contains("rows"))
            seen["plan"] = str(execution.executedPlan().nodeName())

    query = (
        spark.readStream.schema("id long")
        .parquet(str(tmp_path / "in"))
        .observe("rows", F.count(F.lit(1)).alias("n"))
        .writeStream.queryName(name)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .foreachBatch(batch)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert seen == {"observed": True, "plan": "CollectMetrics"}


# --- exception_chain ----------------------------------------------------------------------------


def _raised(error: BaseException, cause: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except type(cause) as inner:
            raise error from inner
    except type(error) as raised:
        return raised


def test_exception_chain_of_python_exceptions() -> None:
    error = _raised(OSError(28, "No space left on device"), KeyError("inner"))
    assert jvm.exception_chain(error) == [
        ("OSError", "[Errno 28] No space left on device"),
        ("KeyError", "'inner'"),
    ]


def test_exception_chain_reads_a_python_traceback_carried_as_text() -> None:
    text = (
        "An exception was raised by the Python Proxy. Return Message: "
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n    g()\n'
        "KeyError: 'inner'\n\nThe above exception was the direct cause of the following "
        "exception:\n\nTraceback (most recent call last):\n"
        '  File "x.py", line 3, in g\n    raise HandoffError(...)\n'
        "flow.errors.HandoffError: the commits folder is read-only\n more words\n"
    )
    assert jvm.exception_chain(StreamingQueryException(message=text)) == [
        ("pyspark.errors.exceptions.base.StreamingQueryException", text),
        ("flow.errors.HandoffError", "the commits folder is read-only"),
        ("KeyError", "'inner'"),
    ]


@pytest.mark.integration
def test_exception_chain_of_a_captured_exception(spark: SparkSession) -> None:
    with accessor("exception_chain"):
        with pytest.raises(AnalysisException) as raised:
            spark.sql("SELECT * FROM flow_no_such_table").collect()
        chain = jvm.exception_chain(raised.value)
        assert chain[0][0] == "pyspark.errors.exceptions.captured.AnalysisException"
        assert chain[1][0].startswith("org.apache.spark.sql.")
        assert chain[1][0].endswith("AnalysisException")
        assert "flow_no_such_table" in chain[1][1]


@pytest.mark.integration
def test_exception_chain_of_a_py4j_error(spark: SparkSession) -> None:
    with accessor("exception_chain"):
        with pytest.raises(jvm.JavaError) as raised:
            jvm.jvm(spark).java.net.URI("::not a uri")
        chain = jvm.exception_chain(raised.value)
        assert [c for c, _ in chain] == [
            "py4j.protocol.Py4JJavaError",
            "java.net.URISyntaxException",
        ]


@pytest.mark.integration
def test_exception_chain_of_a_failed_task(spark: SparkSession) -> None:
    def fail(_: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        raise PermissionError(13, "Permission denied", "/handoff/commits")

    with accessor("exception_chain"):
        with pytest.raises(PythonException) as raised:
            spark.range(1).mapInArrow(fail, "id long").collect()
        assert jvm.exception_chain(raised.value)[-1] == (
            "PermissionError",
            "[Errno 13] Permission denied: '/handoff/commits'",
        )


@pytest.mark.integration
def test_exception_chain_of_a_failed_micro_batch(spark: SparkSession, tmp_path: Path) -> None:
    spark.range(3).write.parquet(str(tmp_path / "in"))

    def batch(_: DataFrame, __: int) -> None:
        raise OSError(28, "No space left on device")

    query = (
        spark.readStream.schema("id long")
        .parquet(str(tmp_path / "in"))
        .writeStream.option("checkpointLocation", str(tmp_path / "checkpoint"))
        .foreachBatch(batch)
        .trigger(availableNow=True)
        .start()
    )
    with accessor("exception_chain"):
        with pytest.raises(StreamingQueryException) as raised:
            query.awaitTermination()
        classes = [c for c, _ in jvm.exception_chain(raised.value)]
        assert classes[:2] == [
            "pyspark.errors.exceptions.captured.StreamingQueryException",
            "org.apache.spark.sql.streaming.StreamingQueryException",
        ]
        assert jvm.exception_chain(raised.value)[-1] == (
            "OSError",
            "[Errno 28] No space left on device",
        )
