"""The one Spark session factory: jars, the Iceberg catalog, Delta and Kafka, ready to use.

Run as a plain Python program, :func:`get_session` launches Spark itself (``local[*]`` unless
``FLOW_SPARK_MASTER`` says otherwise) with the stack's jars. Run under ``spark-submit`` (or
``flow submit``), the JVM already exists: the session keeps everything spark-submit was given
(``--master``, ``--conf``) and adds only what is missing; if the connector jars were not given, it
says how to launch the job so that they are.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Mapping
from typing import Any

from pyspark.sql import SparkSession

from flow import versions
from flow.config import LOOPBACK, StackConfig
from flow.errors import SparkSetupError
from flow.secrets import is_secret
from flow.stack import jars
from flow.stack.project_jar import project_jar
from spark_jobs.conf import (
    CONNECTORS_KEY,
    connectors_given,
    is_local_master,
    required_classes,
    session_conf,
    stack_conf,
)
from spark_jobs.jvm import start_driver_jvm

__all__ = ["get_session", "launched_by_spark_submit", "stack_jars"]


def launched_by_spark_submit() -> bool:
    """True when this Python process was started by spark-submit's PythonRunner."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _check_pyspark() -> None:
    installed = importlib.metadata.version("pyspark")
    if _minor(installed) != _minor(versions.SPARK):
        raise SparkSetupError(
            f"pyspark {installed} is installed, but the stack's connectors are built for Spark "
            f"{versions.SPARK}; install pyspark=={versions.SPARK} "
            "(pip install 'primus-flow[spark]')"
        )


def stack_jars(stack: StackConfig, connectors: frozenset[str] | None = None) -> jars.ResolvedJars:
    """The Spark connector jars (of ``connectors`` only, and Iceberg's; None: all), plus S3's
    (Iceberg S3FileIO, Hadoop S3A) when a location is in S3, and the project's own (its Spark
    operators, compiled on first use: flow.stack.project_jar)."""
    resolved = jars.resolve("spark", stack)
    if connectors is not None:
        optional = jars.PROFILES["spark"].connectors
        resolved = resolved.without(
            m for name, modules in optional if name not in connectors for m in modules
        )
    if stack.uses_s3:
        s3 = jars.resolve("spark-s3", stack)
        resolved = jars.ResolvedJars(
            "spark+s3", resolved.folder, resolved.jars + s3.jars, resolved.driver_classpath
        )
    own = project_jar(stack.jar_cache, jars.pyspark_jars_dir())
    # Also on the driver's system classpath: Hadoop's configuration looks its file systems up
    # there (spark_jobs.conf.FORKLESS_FILES).
    return jars.ResolvedJars(
        resolved.profile, resolved.folder, (*resolved.jars, own), (*resolved.driver_classpath, own)
    )


def _missing_classes(jvm: Any, connectors: frozenset[str] | None) -> list[str]:
    """The connectors (of those the job was given) whose classes the driver JVM cannot load."""
    utils = jvm.org.apache.spark.util.Utils
    wanted = required_classes(connectors)
    return [name for name, cls in wanted.items() if not utils.classIsLoadable(cls)]


def _launch_jvm(settings: Mapping[str, str]) -> None:
    """Start the driver JVM with ``settings`` unless it runs already.

    pyspark launches it with every setting of the session as a ``--conf`` argument, which every
    local user can read in ``ps``; started first with the public ones, it gets the rest when the
    session is created.
    """
    from pyspark import SparkConf

    start_driver_jvm(SparkConf(loadDefaults=False).setAll(list(settings.items())))


def get_session(
    stack: StackConfig | None = None,
    app_name: str = "primus-flow",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """The active session, or a new one configured for ``stack``; ``conf`` adds settings."""
    _check_pyspark()
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    stack = stack or StackConfig.from_env()
    if stack.catalog.type == "sql":
        # sqlite-jdbc creates the file but not its folder; JdbcCatalog then only says "Failed
        # to connect".
        stack.catalog.sqlite_path.parent.mkdir(parents=True, exist_ok=True)
    builder = SparkSession.builder.appName(app_name)

    if launched_by_spark_submit():
        from pyspark import SparkConf

        # Connect to spark-submit's JVM first: until then SparkConf() sees no settings at all.
        driver = start_driver_jvm()
        given = SparkConf()  # what spark-submit set, read from the running JVM
        connectors = connectors_given(given.get(CONNECTORS_KEY, None))
        missing = _missing_classes(driver, connectors)
        if missing:
            raise SparkSetupError(
                f"this job was launched by spark-submit without the stack's jars "
                f"(missing: {', '.join(missing)}). Launch it with `flow submit APP.py`, or add "
                "the output of `flow spark-args` to your spark-submit command"
            )
        master = given.get("spark.master", "local[*]") or "local[*]"
        local = is_local_master(master)
        wanted = {**session_conf(stack, local=local, connectors=connectors), **(conf or {})}
        for key, value in wanted.items():
            if not given.contains(key):
                builder = builder.config(key, value)
        spark = builder.getOrCreate()
    else:
        master = stack.spark.master
        # Python workers (mapInArrow, UDFs) would otherwise run whatever `python3` is on PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        if is_local_master(master):
            # Spark's web UI binds to SPARK_LOCAL_IP, not spark.driver.bindAddress.
            os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
        resolved = stack_jars(stack)
        settings = {
            **stack_conf(stack, resolved.jars, resolved.driver_classpath, master=master),
            **(conf or {}),
        }
        _launch_jvm({k: v for k, v in settings.items() if not is_secret(k, v)})
        # The secrets reach the running JVM through py4j, not its command line.
        for key, value in settings.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()

    if _minor(spark.version) != _minor(versions.SPARK):
        raise SparkSetupError(
            f"the Spark runtime is {spark.version} (SPARK_HOME={os.environ.get('SPARK_HOME')}), "
            f"but the connectors are built for {versions.SPARK}; use a Spark "
            f"{_minor(versions.SPARK)} installation or unset SPARK_HOME to use pyspark's own"
        )
    return spark
