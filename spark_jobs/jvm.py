"""Spark's private API, reached from this module only.

Some of what Primus Flow does has no public pyspark API: a plan prepared before it runs, a cache
asked whether it is filled, the metrics of a running micro-batch's plan, the job group of the
calling thread, a session made current for a warm driver's job, the driver's heap after a
collection. Each of those reaches through a private attribute of pyspark (``_jdf``, ``_jsq``,
``_jvm``, ``_jsc``, ``_jsparkSession``) or through ``SparkContext``, which Spark Connect does not
have, into py4j and the JVM. A Spark upgrade may rename any of them; here each is one
function, named for what it gives, whose docstring says which private thing it reaches and why
there is no public way, and tests/spark_jobs/test_jvm.py checks each against the running Spark.
``tests/spark_jobs/test_jvm_boundary.py`` fails when such an access appears anywhere else.

What an accessor returns may be a Java object (py4j's proxy, typed :data:`JavaObject`); its
methods are Spark's Scala API, which the caller uses and test_jvm.py calls too.

:func:`exception_chain` turns a failure that crossed py4j into the classes and messages of its
causes, so that failures can be told apart by class rather than by the text of a trace.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from py4j.protocol import Py4JError, Py4JJavaError

if TYPE_CHECKING:
    from pyspark import SparkConf, StatusTracker
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = [
    "DriverMemory",
    "JavaError",
    "JavaObject",
    "cache_builder",
    "cancel_all_jobs",
    "classes_compiled",
    "codegen_text",
    "context_stop_replaced",
    "context_stopped",
    "default_parallelism",
    "driver_memory",
    "exception_chain",
    "executed_plan",
    "hadoop_conf",
    "jvm",
    "last_execution",
    "launch_conf",
    "local_property",
    "make_current",
    "project_operator",
    "set_job_group",
    "set_local_property",
    "standalone_jvm",
    "start_driver_jvm",
    "status_tracker",
]

JavaObject = Any
"""A py4j proxy of a JVM object (py4j has no type hints): its methods are the Java/Scala API."""

JavaError = Py4JJavaError
"""What a call into the JVM raises when the Java side threw and pyspark did not convert it into
one of ``pyspark.errors``' classes (so ``except (PySparkException, JavaError)`` catches both)."""


# --- the driver JVM -----------------------------------------------------------------------------


def start_driver_jvm(conf: SparkConf | None = None) -> JavaObject:
    """The driver JVM's view (py4j ``JVMView``), launched with ``conf`` unless one runs already
    (under spark-submit: spark-submit's, whose settings ``SparkConf()`` reads only after this).

    Reaches ``SparkContext._ensure_initialized`` and ``SparkContext._jvm``. No public way: the
    JVM is public only through a SparkContext, and creating one passes every setting on the
    JVM's command line (spark_jobs.session starts it with the public ones first), and a check
    of the classpath before a session exists needs the JVM itself.
    """
    from pyspark import SparkContext

    SparkContext._ensure_initialized(conf=conf)
    return SparkContext._jvm


def jvm(spark: SparkSession) -> JavaObject:
    """The session's driver JVM view (py4j ``JVMView``): Spark's and the connectors' classes by
    name, e.g. ``jvm(spark).org.apache.spark.util.Utils``.

    Reaches ``SparkSession._jvm``. No public way: pyspark does not expose the JVM.
    """
    return spark._jvm


def hadoop_conf(spark: SparkSession) -> JavaObject:
    """The session's Hadoop configuration (``org.apache.hadoop.conf.Configuration``), the one
    Spark opens its file systems with.

    Reaches ``SparkContext._jsc``. No public way: pyspark gives only the Spark settings.
    """
    return spark.sparkContext._jsc.hadoopConfiguration()


@contextmanager
def standalone_jvm() -> Iterator[JavaObject]:
    """A driver JVM of its own, with no SparkContext and no session, for asking Spark's classes
    something (how a trigger's interval parses) without starting the stack; stopped after.

    Reaches ``pyspark.java_gateway.launch_gateway`` and the gateway's process. No public way:
    pyspark starts a JVM only as part of a SparkContext.
    """
    from pyspark.java_gateway import launch_gateway

    gateway = launch_gateway()  # type: ignore[no-untyped-call]
    try:
        yield gateway.jvm
    finally:
        gateway.shutdown()
        gateway.proc.stdin.close()  # the gateway server exits when its stdin closes
        gateway.proc.wait(timeout=60)


@dataclass(frozen=True)
class DriverMemory:
    """The driver JVM's memory, in bytes, as its ``MemoryMXBean`` reports it."""

    heap_used: int
    heap_committed: int
    heap_max: int
    non_heap_used: int
    """Metaspace, the code cache and the like: grows with the classes Spark's codegen makes."""
    pid: int
    """The JVM's process id (its resident size: ``/proc/<pid>/status`` on Linux)."""


def driver_memory(spark: SparkSession, *, collect: bool = False) -> DriverMemory:
    """The driver JVM's heap and non-heap use; with ``collect``, after a full collection
    (``System.gc()``: a stop-the-world pause of the whole driver, ~0.1-0.3 s for a few hundred MB
    live), so that what is used is what is held, not garbage not yet collected.

    Reaches ``SparkSession._jvm`` (through :func:`jvm`) for ``java.lang.management``. No public
    way: Spark's metrics report the driver's memory as peaks, to a metrics sink or the UI's REST
    API, never after a collection.
    """
    java = jvm(spark).java.lang
    if collect:
        java.System.gc()
    management = java.management.ManagementFactory
    heap = management.getMemoryMXBean().getHeapMemoryUsage()
    non_heap = management.getMemoryMXBean().getNonHeapMemoryUsage()
    return DriverMemory(
        heap_used=int(heap.getUsed()),
        heap_committed=int(heap.getCommitted()),
        heap_max=int(heap.getMax()),
        non_heap_used=int(non_heap.getUsed()),
        pid=int(management.getRuntimeMXBean().getPid()),
    )


# --- the SparkContext ---------------------------------------------------------------------------


def launch_conf(spark: SparkSession) -> SparkConf:
    """The settings the driver was launched with (``SparkConf``: spark-submit's ``--conf``s and
    the builder's), as opposed to the session's SQL settings.

    Reaches ``SparkSession.sparkContext.getConf()``. No public way: ``spark.conf`` answers every
    SQL setting with its default, so it cannot say whether one was *given*
    (``spark.sql.shuffle.partitions``), and it has no settings that are not SQL ones.
    """
    return spark.sparkContext.getConf()


def default_parallelism(spark: SparkSession) -> int:
    """The cluster's default parallelism: the cores of ``local[*]``, the executors' cores on a
    cluster (what a stage sizes its tasks and shuffle partitions by).

    Reaches ``SparkSession.sparkContext.defaultParallelism``. No public way in the SQL API.
    """
    return int(spark.sparkContext.defaultParallelism)


def status_tracker(spark: SparkSession) -> StatusTracker:
    """The driver's job and stage tracker: which jobs run, of which group, with how many stages.

    Reaches ``SparkSession.sparkContext.statusTracker()``. No public way in the SQL API; the
    streaming query listener says when a batch ends, not which of its jobs are submitted.
    """
    return spark.sparkContext.statusTracker()


def local_property(spark: SparkSession, key: str) -> str | None:
    """The calling thread's local property ``key`` (``spark.jobGroup.id``: the job group a
    streaming query sets for its batches' jobs), or None.

    Reaches ``SparkSession.sparkContext.getLocalProperty``. No public way in the SQL API.
    """
    return spark.sparkContext.getLocalProperty(key)


def set_local_property(spark: SparkSession, key: str, value: str | None) -> None:
    """Set the calling thread's local property ``key`` (None removes it): the jobs this thread
    submits then carry it to their tasks (``TaskContext.getLocalProperty``).

    Reaches ``SparkSession.sparkContext.setLocalProperty``. No public way in the SQL API.
    """
    spark.sparkContext.setLocalProperty(key, value)  # type: ignore[arg-type]


def set_job_group(spark: SparkSession, group: str, description: str) -> None:
    """Put the calling thread's next jobs in job ``group`` (what Structured Streaming does for a
    query's batches); :func:`set_local_property` with None on ``spark.jobGroup.id`` and
    ``spark.job.description`` takes them out again.

    Reaches ``SparkSession.sparkContext.setJobGroup``. No public way in the SQL API: its job
    tags (``spark.addTag``) are not the group a streaming query's jobs carry.
    """
    spark.sparkContext.setJobGroup(group, description)


def cancel_all_jobs(spark: SparkSession) -> None:
    """Cancel every job the driver runs (a warm driver's job whose caller went away).

    Reaches ``SparkSession.sparkContext.cancelAllJobs()``. ``spark.interruptAll()`` interrupts
    the operations of one session only, and a warm driver's job runs in a session of its own.
    """
    spark.sparkContext.cancelAllJobs()


def context_stopped(spark: SparkSession) -> bool:
    """Whether the session's SparkContext was stopped (then no job can run on this driver).

    Reaches ``SparkContext._jsc``, which ``SparkContext.stop()`` sets to None. No public way:
    a stopped context has no flag of its own.
    """
    return spark.sparkContext._jsc is None


@contextmanager
def context_stop_replaced(spark: SparkSession, stop: Callable[..., None]) -> Iterator[None]:
    """Within the block, ``spark.sparkContext.stop()`` calls ``stop`` instead (a job run in a warm
    driver ends with ``spark.stop()``, which must not stop the context every job shares).

    Reaches ``SparkSession.sparkContext`` and shadows its ``stop`` method on the instance. No
    public way: pyspark has no hook on stopping.
    """
    context = spark.sparkContext
    setattr(context, "stop", stop)  # noqa: B010
    try:
        yield
    finally:
        delattr(context, "stop")


def make_current(session: SparkSession) -> None:
    """Make ``session`` the one ``SparkSession.getActiveSession()``, ``builder.getOrCreate()`` and
    the JVM's ``SparkSession.active`` give, in Python and in the JVM (for a warm driver's job).

    Reaches ``SparkSession._instantiatedSession``, ``SparkSession._activeSession``,
    ``SparkSession._get_j_spark_session_class`` and ``SparkSession._jsparkSession``. No public
    way: pyspark makes a session current only when it creates it.
    """
    from pyspark.sql import SparkSession

    sessions = SparkSession._get_j_spark_session_class(session._jvm)
    SparkSession._instantiatedSession = session
    SparkSession._activeSession = session
    sessions.setDefaultSession(session._jsparkSession)
    sessions.setActiveSession(session._jsparkSession)


# --- plans --------------------------------------------------------------------------------------


def executed_plan(df: DataFrame) -> JavaObject:
    """``df``'s physical plan (Java ``SparkPlan``), planned now if it was not: ``prepare()``
    starts its broadcasts, ``children()``, ``metrics()`` and ``toString()`` describe it.

    Reaches ``DataFrame._jdf.queryExecution().executedPlan()``. No public way: ``explain()``
    prints text, and planning otherwise happens only when an action runs.
    """
    return df._jdf.queryExecution().executedPlan()


def plan_size_bytes(df: DataFrame) -> int | None:
    """The optimizer's estimate of ``df``'s size in bytes (from the files' sizes for a table
    scan), without running it; None when Spark has no estimate (its "unknown" is Long.MaxValue).

    Reaches ``DataFrame._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()``. No
    public way: ``explain("cost")`` prints it as text.
    """
    # A Scala BigInt: py4j hands it over as a Python int (str() of a Java object would do too).
    size = int(str(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()))
    return None if size >= 2**63 - 1 else size


def codegen_text(df: DataFrame) -> str:
    """The Java source Spark generates for ``df`` (``explain("codegen")``'s text), to check what
    is compiled into it.

    Reaches ``SparkSession._jvm``'s ``PythonSQLUtils.explainString`` and ``DataFrame._jdf``. No
    public way: ``explain()`` prints and returns nothing.
    """
    utils = jvm(df.sparkSession).PythonSQLUtils
    return str(utils.explainString(df._jdf.queryExecution(), "codegen"))


def classes_compiled(spark: SparkSession) -> int:
    """How many classes Spark's code generation has compiled in this JVM so far (the misses of
    its cache of generated classes: a plan made again that compiles nothing was a hit).

    Reaches ``SparkSession._jvm``'s ``CodegenMetrics.METRIC_COMPILATION_TIME`` (a histogram of
    one entry per compilation). No public way: Spark's metrics system reports it only to a sink.
    """
    metrics = jvm(spark).org.apache.spark.metrics.source.CodegenMetrics
    return int(metrics.METRIC_COMPILATION_TIME().getCount())


def cache_builder(df: DataFrame) -> JavaObject | None:
    """The cache of a persisted ``df`` (Java ``CachedRDDBuilder``:
    ``isCachedColumnBuffersLoaded()`` says whether every partition is stored), or None when
    ``df`` is not cached.

    Reaches ``DataFrame._jdf.queryExecution().withCachedData()``'s ``InMemoryRelation``. No
    public way: ``df.storageLevel`` says that it is to be cached, not that it is.
    """
    try:
        return df._jdf.queryExecution().withCachedData().cacheBuilder()
    except Py4JError:  # the plan is not an InMemoryRelation
        return None


def project_operator(df: DataFrame, name: str, *args: Any) -> DataFrame:
    """``df`` through one of Primus Flow's own Spark operators (the JVM class
    ``flow.spark.<name>``'s static ``apply(Dataset<Row>, ...)``, from the project's jar:
    flow.stack.project_jar), as a DataFrame again. Python lists among ``args`` reach Java as
    ``java.util.List``.

    Reaches ``DataFrame._jdf`` and ``SparkSession._jvm``, and wraps the Java Dataset it gets back
    with pyspark's ``DataFrame(jdf, session)``. No public way: pyspark runs JVM code on a
    DataFrame only through its own API (a ``transformWithState`` processor, for one, can only be
    written in Python there, which costs a socket round trip per state access).
    """
    from pyspark.sql import DataFrame as Frame

    spark = df.sparkSession
    operator = getattr(jvm(spark).flow.spark, name)
    return Frame(operator.apply(df._jdf, *args), spark)


def last_execution(query: StreamingQuery) -> JavaObject:
    """The running (or last) micro-batch's execution of ``query`` (Java ``IncrementalExecution``:
    ``executedPlan()`` with its operators' metrics, ``observedMetrics()``), or None before its
    first batch.

    Reaches ``StreamingQuery._jsq.streamingQuery().lastExecution()``. No public way:
    ``lastProgress`` comes after the batch and sums the operators' metrics, not by operator.
    """
    return query._jsq.streamingQuery().lastExecution()


# --- failures -----------------------------------------------------------------------------------

_TRACEBACK = "Traceback (most recent call last):"
_MAX_CAUSES = 64
_RAISED = re.compile(r"^(?P<name>[A-Za-z_][\w.]*)(?::\s?(?P<message>.*))?$")


def exception_chain(error: BaseException) -> list[tuple[str, str]]:
    """``(class, message)`` of ``error`` and each of its causes, outermost first: the Python
    exception's fully qualified class (``builtins`` left out), then the Java throwable behind
    it (pyspark's captured exceptions, py4j's ``Py4JJavaError``) and its ``getCause()`` chain,
    then its Python ``__cause__`` (or unsuppressed ``__context__``), and so on. Messages are as
    given ("" for none); a Java message may hold a whole plan.

    A Python exception that crossed the JVM as text (raised in a ``foreachBatch`` function, or
    in a Python worker's task) is in the chain too: the innermost message that holds a Python
    traceback is read, and the exceptions it ends with follow that entry, outermost first, under
    the class names the traceback gives (``OSError``, ``flow.errors.HandoffError``) and the
    first line of their message. So a disk that is full inside a micro-batch reads
    ``[..., ("py4j.Py4JException", ...), ("OSError", "[Errno 28] No space left on device")]``.

    Reaches pyspark's ``CapturedException._origin``, ``_desc`` and ``_cause`` and py4j's
    ``Py4JJavaError.java_exception``. No public way: pyspark exposes a captured exception's
    condition and message, not its Java class nor its causes.
    """
    chain: list[tuple[str, str]] = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append((_qualified(type(current)), _message(current)))
        throwable = _java_throwable(current)
        cause = getattr(current, "_cause", None)  # a captured exception made from text
        if throwable is None and isinstance(cause, BaseException) and id(cause) not in seen:
            seen.add(id(cause))
            chain.append((_qualified(type(cause)), _message(cause)))
            throwable = _java_throwable(cause)
        if throwable is not None:
            chain.extend(_java_chain(throwable))
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    carrier = max((i for i, (_, m) in enumerate(chain) if _TRACEBACK in m), default=None)
    if carrier is None:
        return chain
    return [*chain[: carrier + 1], *_tracebacks(chain[carrier][1]), *chain[carrier + 1 :]]


def _qualified(cls: type) -> str:
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def _message(error: BaseException) -> str:
    desc = getattr(error, "_desc", None)  # a captured exception's str() appends the JVM trace
    if isinstance(desc, str):
        return desc
    if isinstance(error, Py4JJavaError):
        return str(error.errmsg)  # its str() is the Java trace
    return str(error)


def _java_throwable(error: BaseException) -> JavaObject | None:
    if isinstance(error, Py4JJavaError):
        return error.java_exception
    return getattr(error, "_origin", None)  # pyspark's CapturedException made from a throwable


def _java_chain(throwable: JavaObject) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for _ in range(_MAX_CAUSES):  # Java allows a cycle of causes
        if throwable is None:
            break
        message = throwable.getMessage()
        found.append((str(throwable.getClass().getName()), "" if message is None else str(message)))
        throwable = throwable.getCause()
    return found


def _tracebacks(text: str) -> list[tuple[str, str]]:
    """The exceptions of the Python traceback(s) in ``text``, outermost first (Python prints a
    chain's root first), each with the first line of its message."""
    found: list[tuple[str, str]] = []
    for block in text.split(_TRACEBACK)[1:]:
        # Frames are indented; the exception is the first line after them that is not.
        line = next((x for x in block.splitlines() if x and not x[0].isspace()), "")
        raised = _RAISED.match(line)
        if raised is not None:
            found.append((raised["name"], (raised["message"] or "").strip()))
    return found[::-1]
