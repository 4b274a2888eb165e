"""The Spark settings that give a session the stack: jars, the Iceberg catalog, Delta, UTC.

Pure functions from a :class:`StackConfig` (and resolved jars) to ``spark.*`` key/value pairs, so
the same settings reach a session pyspark launches, a ``flow submit`` command line and a plain
``spark-submit`` (``flow spark-args``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from flow.config import LOOPBACK, CatalogConfig, S3Config, StackConfig, is_s3
from flow.stack.iceberg import s3_properties
from flow.stack.project_jar import is_project_jar

__all__ = [
    "CODEGEN_CACHE",
    "CONNECTORS_KEY",
    "FORKLESS_FILES",
    "LAUNCH_KEYS",
    "REQUIRED_CLASSES",
    "catalog_conf",
    "connectors_given",
    "is_local_master",
    "required_classes",
    "s3_conf",
    "session_conf",
    "stack_conf",
]

ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
DELTA_EXTENSIONS = "io.delta.sql.DeltaSparkSessionExtension"

#: Settings that only take effect when the JVM is launched; a running session cannot change them.
LAUNCH_KEYS = frozenset(
    {
        "spark.master",
        "spark.jars",
        "spark.driver.extraClassPath",
        "spark.driver.extraJavaOptions",
        "spark.driver.memory",
    }
)

#: WARN-level driver logging (spark-submit's own default is INFO).
DRIVER_LOG4J2 = Path(__file__).with_name("log4j2.properties")

#: A class of each connector, checked in the driver JVM to tell a missing jar early and clearly.
REQUIRED_CLASSES = {
    "Iceberg (iceberg-spark-runtime)": "org.apache.iceberg.spark.SparkCatalog",
    "Delta (delta-spark)": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "Kafka (spark-sql-kafka)": "org.apache.spark.sql.kafka010.KafkaSourceProvider",
    "SQLite JDBC (sqlite-jdbc)": "org.sqlite.JDBC",
    "Primus Flow's operators (flow.stack.project_jar)": "flow.spark.ImmediatePositives",
}


#: The connectors of :data:`REQUIRED_CLASSES` a job can be launched without.
_OPTIONAL_CLASSES = {"delta": "Delta (delta-spark)", "kafka": "Kafka (spark-sql-kafka)"}

CONNECTORS_KEY = "spark.flow.connectors"
"""The optional connectors (flow.engine.CONNECTORS) a job was launched with, comma-separated:
the session then asks for no others' extensions, catalogs or classes. Unset: all of them."""

FORKLESS_FILES = {
    "spark.hadoop.fs.file.impl": "flow.spark.ForklessLocalFileSystem",
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "flow.spark.ForklessLocalFs",
}
"""A local session's ``file:`` file systems: Hadoop's, without the ``chmod`` process it starts
for each file it creates and the two ``readlink`` it starts for each rename (it has no native
library here). A live micro-batch writes some 35 checkpoint files; with Hadoop's own, a state
store's commit took 85 ms a partition (spark_jobs/java/flow/spark/ForklessRawLocalFileSystem.java
says more). Local masters only: there the driver is the executor, and the jar is on its system
classpath (spark_jobs.session.stack_jars puts it there), where Hadoop's configuration finds
classes whatever thread asks; set only where it is."""

CODEGEN_CACHE = "spark.sql.codegen.cache.maxEntries"
"""How many generated classes Spark keeps per JVM (see :func:`session_conf`)."""


def connectors_given(value: str | None) -> frozenset[str] | None:
    """The connectors :data:`CONNECTORS_KEY` names (None: unset, all)."""
    if value is None:
        return None
    return frozenset(n for n in value.split(",") if n)


def required_classes(connectors: frozenset[str] | None) -> dict[str, str]:
    """:data:`REQUIRED_CLASSES` of a job with ``connectors`` (None: all)."""
    if connectors is None:
        return dict(REQUIRED_CLASSES)
    left_out = {name for c, name in _OPTIONAL_CLASSES.items() if c not in connectors}
    return {name: cls for name, cls in REQUIRED_CLASSES.items() if name not in left_out}


def is_local_master(master: str) -> bool:
    return master.startswith("local")


def _workers_run_this_python() -> bool:
    """Python workers will run this interpreter (so they can import this package)."""
    chosen = os.environ.get("PYSPARK_PYTHON")
    return chosen is None or os.path.realpath(chosen) == os.path.realpath(sys.executable)


def catalog_conf(catalog: CatalogConfig) -> dict[str, str]:
    """The Iceberg ``SparkCatalog`` that opens the same catalog as pyiceberg; on an ``s3://``
    warehouse, with S3FileIO and the stack's S3 settings (FLOW_CATALOG_PROPERTIES wins)."""
    prefix = f"spark.sql.catalog.{catalog.name}"
    conf = {prefix: "org.apache.iceberg.spark.SparkCatalog"}
    if catalog.type == "sql":
        conf[f"{prefix}.catalog-impl"] = "org.apache.iceberg.jdbc.JdbcCatalog"
        conf[f"{prefix}.uri"] = f"jdbc:sqlite:{catalog.sqlite_path}"
        # V1 adds the iceberg_type column pyiceberg's schema lacks and reads its rows as tables.
        conf[f"{prefix}.jdbc.schema-version"] = "V1"
    else:
        conf[f"{prefix}.type"] = "rest"
        conf[f"{prefix}.uri"] = catalog.uri
    conf[f"{prefix}.warehouse"] = catalog.warehouse
    if is_s3(catalog.warehouse):
        conf[f"{prefix}.io-impl"] = "org.apache.iceberg.aws.s3.S3FileIO"
        for key, value in s3_properties(catalog.s3, java=True).items():
            conf[f"{prefix}.{key}"] = value
    for key, value in catalog.properties.items():
        conf[f"{prefix}.{key}"] = value
    return conf


def s3_conf(s3: S3Config) -> dict[str, str]:
    """Hadoop's S3A (streaming checkpoints; ``s3://`` read as ``s3a://``) with the stack's S3
    settings, and the executors' environment, from which their Python tasks' pyarrow reads the
    same settings (:func:`flow.storage.location`)."""
    hadoop = "spark.hadoop.fs.s3a"
    conf = {
        "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        f"{hadoop}.endpoint.region": s3.region,
        f"{hadoop}.path.style.access": str(s3.path_style).lower(),
    }
    if s3.endpoint:
        conf[f"{hadoop}.endpoint"] = s3.endpoint
        conf[f"{hadoop}.connection.ssl.enabled"] = str(s3.scheme == "https").lower()
    if s3.access_key and s3.secret_key:
        conf[f"{hadoop}.access.key"] = s3.access_key
        conf[f"{hadoop}.secret.key"] = s3.secret_key
        if s3.session_token:
            conf[f"{hadoop}.session.token"] = s3.session_token
            conf[f"{hadoop}.aws.credentials.provider"] = (
                "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
            )
    for name, value in s3.environment().items():
        conf[f"spark.executorEnv.{name}"] = value
    return conf


def _delta_conf(*, local: bool) -> dict[str, str]:
    conf = {
        "spark.sql.extensions": f"{ICEBERG_EXTENSIONS},{DELTA_EXTENSIONS}",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    }
    if local:
        # Delta's 50 snapshot partitions are sized for clusters (see the shuffle partitions).
        conf["spark.databricks.delta.snapshotPartitions"] = str(max(2, os.cpu_count() or 2))
    return conf


def session_conf(
    stack: StackConfig, *, local: bool, connectors: frozenset[str] | None = None
) -> dict[str, str]:
    """Settings a session can take at creation: catalogs, extensions, time zone, local tuning;
    Delta's extension and catalog unless ``connectors`` leaves Delta out (None: all)."""
    conf = {
        "spark.sql.extensions": ICEBERG_EXTENSIONS,
        # Event-time pipelines compare timestamps across sources; one zone avoids surprises.
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.warehouse.dir": str(stack.home / "spark-warehouse"),
        # HotSpot never JIT-compiles a method of more than 8,000 bytes of bytecode, and
        # whole-stage codegen makes the Kafka parse (spark_jobs.validate: from_json into a map
        # and ~20 checks) one method of 10-22 kB, which then runs interpreted. At 8000 (Spark's
        # advice for HotSpot; its default is 65535) Spark falls back for such methods: parse
        # executor CPU 3.2-4.1 s -> 1.8-2.0 s per 200,000 records (the whole driver JVM's,
        # 4.4 -> 3.6 s), the same output. HotSpot's limit holds on any master's executors, so
        # every master gets it; --conf sets it back.
        "spark.sql.codegen.hugeMethodLimit": "8000",
        # Spark keeps the classes it generated for 100 plans (by their source) per JVM. A live
        # stage's micro-batch runs more than that (the parse and its checks, each stateful
        # operator's projections, the enrichment, the features, the writers), so at 100 the
        # cache evicted each batch what the next one needed: Janino compiled them again and
        # HotSpot's JIT after it. Counted in the driver's log (CodeGenerator, INFO) over
        # `flow bench stages --only live`: at 100, 129-146 classes compiled every turn of 4
        # batches, the hand-written query's 67 each turn too (the stage evicted them); at
        # 1000, none after the first turn. A cached class is tens of kB; a static setting,
        # read when the JVM first generates code, so every master (each executor) gets it.
        CODEGEN_CACHE: "1000",
        **catalog_conf(stack.catalog),
    }
    if stack.uses_s3:
        conf.update(s3_conf(stack.s3))
    if local:
        cores = os.cpu_count() or 2
        conf.update(
            {
                "spark.driver.bindAddress": LOOPBACK,
                "spark.driver.host": LOOPBACK,
                # 200 shuffle partitions are sized for clusters; on one machine they turn a
                # small job into hundreds of tiny tasks.
                # One per core: a stateful stream keeps a state store per partition and side,
                # and their per-batch commits dominate small micro-batches (measured: 2 vs 4
                # partitions, 3.4k vs 2.0k rows/s at 20k rows per batch on 2 cores).
                "spark.sql.shuffle.partitions": str(max(2, cores)),
                # On one machine shuffle blocks never cross a network, and CPU is what runs
                # out: LZ4 on them was 30-45 % of the handoff export's JVM task time
                # (async-profiler), and the export ran 8-13 % faster without it (Spark-write
                # runs in docs/experiments/2026-11-22-handoff.md). Spills stay compressed.
                # Set it back with --conf spark.shuffle.compress=true where local disk is the
                # tighter limit.
                "spark.shuffle.compress": "false",
                # Below 200 reducers and without map-side aggregation Spark writes a file per
                # reducer and then copies them all into one; with 0 it sorts serialized rows in
                # memory by reducer and writes them once (its path for bigger shuffles). The
                # export vs Parquet, 4 pairs of processes: median 1.04 with it, 0.87 without.
                "spark.shuffle.sort.bypassMergeThreshold": "0",
            }
        )
        if _workers_run_this_python():
            # Python tasks without re-reading Spark's archives or collecting pyspark's objects
            # each time: 16 empty Arrow tasks took 1.5 s, 0.56 s with it (spark_jobs.pyworker).
            conf["spark.python.daemon.module"] = "spark_jobs.pyworker"
    if connectors is None or "delta" in connectors:
        conf.update(_delta_conf(local=local))
    return conf


def stack_conf(
    stack: StackConfig,
    jars: Sequence[Path],
    driver_classpath: Sequence[Path],
    *,
    master: str,
    connectors: frozenset[str] | None = None,
) -> dict[str, str]:
    """Every setting for a job on ``master``: :func:`session_conf` plus the launch-only ones;
    ``connectors`` (None: all) is recorded for the session (:data:`CONNECTORS_KEY`)."""
    local = is_local_master(master)
    conf = {
        "spark.master": master,
        "spark.jars": ",".join(str(j) for j in jars),
        # JDBC drivers register with java.sql.DriverManager only from the system classpath.
        "spark.driver.extraClassPath": ":".join(str(j) for j in driver_classpath),
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{DRIVER_LOG4J2}",
        **session_conf(stack, local=local, connectors=connectors),
    }
    if connectors is not None:
        conf[CONNECTORS_KEY] = ",".join(sorted(connectors))
    if local:
        conf["spark.driver.memory"] = stack.spark.driver_memory
        if any(is_project_jar(p) for p in driver_classpath):
            conf.update(FORKLESS_FILES)
    return conf
