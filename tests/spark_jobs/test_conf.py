from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flow.config import StackConfig
from spark_jobs.conf import (
    CODEGEN_CACHE,
    FORKLESS_FILES,
    ICEBERG_EXTENSIONS,
    LAUNCH_KEYS,
    REQUIRED_CLASSES,
    catalog_conf,
    connectors_given,
    required_classes,
    session_conf,
    stack_conf,
)


def test_the_sql_catalog_opens_the_same_sqlite_file_as_pyiceberg(tmp_path: Path) -> None:
    stack = StackConfig.from_env({"FLOW_HOME": str(tmp_path)})
    conf = catalog_conf(stack.catalog)
    assert conf["spark.sql.catalog.flow"] == "org.apache.iceberg.spark.SparkCatalog"
    assert conf["spark.sql.catalog.flow.catalog-impl"] == "org.apache.iceberg.jdbc.JdbcCatalog"
    assert conf["spark.sql.catalog.flow.uri"] == f"jdbc:sqlite:{stack.catalog.sqlite_path}"
    assert conf["spark.sql.catalog.flow.jdbc.schema-version"] == "V1"
    assert conf["spark.sql.catalog.flow.warehouse"] == stack.catalog.warehouse


def test_a_rest_catalog_passes_its_properties_through() -> None:
    stack = StackConfig.from_env(
        {
            "FLOW_CATALOG_NAME": "lake",
            "FLOW_CATALOG_TYPE": "rest",
            "FLOW_CATALOG_URI": "http://iceberg-rest:8181",
            "FLOW_WAREHOUSE": "s3://warehouse/",
            "FLOW_CATALOG_PROPERTIES": "io-impl=org.apache.iceberg.aws.s3.S3FileIO",
        }
    )
    conf = catalog_conf(stack.catalog)
    assert conf["spark.sql.catalog.lake.type"] == "rest"
    assert conf["spark.sql.catalog.lake.uri"] == "http://iceberg-rest:8181"
    assert conf["spark.sql.catalog.lake.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert "spark.sql.catalog.lake.catalog-impl" not in conf


def test_local_sessions_bind_to_loopback_and_clusters_are_left_alone(tmp_path: Path) -> None:
    stack = StackConfig.from_env({"FLOW_HOME": str(tmp_path)})
    local = session_conf(stack, local=True)
    cluster = session_conf(stack, local=False)
    assert local["spark.driver.bindAddress"] == "127.0.0.1"
    assert "spark.driver.bindAddress" not in cluster
    assert "spark.sql.shuffle.partitions" not in cluster
    assert local["spark.shuffle.compress"] == "false"
    assert "spark.shuffle.compress" not in cluster  # blocks cross the network there
    assert local["spark.shuffle.sort.bypassMergeThreshold"] == "0"
    assert "spark.shuffle.sort.bypassMergeThreshold" not in cluster
    assert "spark.python.daemon.module" not in cluster  # executors may lack this package
    for conf in (local, cluster):
        assert "IcebergSparkSessionExtensions" in conf["spark.sql.extensions"]
        assert "DeltaSparkSessionExtension" in conf["spark.sql.extensions"]
        assert conf["spark.sql.session.timeZone"] == "UTC"


def test_launch_settings_carry_jars_and_the_jdbc_driver(tmp_path: Path) -> None:
    stack = StackConfig.from_env({"FLOW_HOME": str(tmp_path)})
    jars = [tmp_path / "a.jar", tmp_path / "sqlite-jdbc-3.jar"]
    conf = stack_conf(stack, jars, jars[1:], master="spark://m:7077")
    assert conf["spark.master"] == "spark://m:7077"
    assert conf["spark.jars"] == f"{jars[0]},{jars[1]}"
    assert conf["spark.driver.extraClassPath"] == str(jars[1])
    assert "spark.driver.memory" not in conf  # a cluster's driver memory is the user's call
    assert set(conf) | {"spark.driver.memory"} >= LAUNCH_KEYS


def test_local_sessions_write_files_without_starting_processes_where_the_project_jar_is(
    tmp_path: Path,
) -> None:
    """Hadoop's local file system starts chmod and readlink processes for each checkpoint
    file; the project's own does not (spark_jobs.conf.FORKLESS_FILES). Its classes are looked
    up on the driver's system classpath, so they are named only where the jar is there."""
    stack = StackConfig.from_env({"FLOW_HOME": str(tmp_path)})
    own = tmp_path / "flow-jvm" / "primus-flow-0123456789abcdef.jar"
    jdbc = tmp_path / "sqlite-jdbc-3.jar"
    local = stack_conf(stack, [jdbc, own], [jdbc, own], master="local[2]")
    assert {k: local[k] for k in FORKLESS_FILES} == FORKLESS_FILES
    assert local["spark.hadoop.fs.file.impl"] == "flow.spark.ForklessLocalFileSystem"
    assert str(own) in local["spark.driver.extraClassPath"].split(":")
    without_jar = stack_conf(stack, [jdbc, own], [jdbc], master="local[2]")
    cluster = stack_conf(stack, [jdbc, own], [jdbc, own], master="spark://m:7077")
    for conf in (without_jar, cluster):
        assert not set(FORKLESS_FILES) & set(conf)


def test_local_python_workers_use_the_lean_daemon_only_when_they_run_this_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = StackConfig.from_env({"FLOW_HOME": str(tmp_path)})
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert session_conf(stack, local=True)["spark.python.daemon.module"] == "spark_jobs.pyworker"
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    assert "spark.python.daemon.module" in session_conf(stack, local=True)
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/other/python3")
    assert "spark.python.daemon.module" not in session_conf(stack, local=True)


def test_every_master_gets_the_jit_sized_codegen_limit(tmp_path: Path) -> None:
    stack = StackConfig.from_env({"FLOW_HOME": str(tmp_path)})
    for local in (True, False):  # HotSpot's limit is the same on a cluster's executors
        assert session_conf(stack, local=local)["spark.sql.codegen.hugeMethodLimit"] == "8000"


def test_every_master_keeps_more_generated_classes_than_a_live_batch_runs(tmp_path: Path) -> None:
    stack = StackConfig.from_env({"FLOW_HOME": str(tmp_path)})
    for local in (True, False):  # each executor's JVM has a cache of its own
        assert int(session_conf(stack, local=local)[CODEGEN_CACHE]) >= 500


def test_a_session_without_delta_asks_for_neither_its_extension_nor_its_classes(
    tmp_path: Path,
) -> None:
    stack = StackConfig.from_env({"FLOW_HOME": str(tmp_path)})
    bare = session_conf(stack, local=True, connectors=frozenset())
    assert bare["spark.sql.extensions"] == ICEBERG_EXTENSIONS
    assert not any("delta" in key for key in bare)
    assert set(required_classes(frozenset())) == {
        "Iceberg (iceberg-spark-runtime)",
        "SQLite JDBC (sqlite-jdbc)",
        "Primus Flow's operators (flow.stack.project_jar)",
    }
    assert "Kafka (spark-sql-kafka)" in required_classes(frozenset({"kafka"}))
    assert required_classes(None) == REQUIRED_CLASSES
    assert connectors_given(None) is None  # a plain spark-submit $(flow spark-args): all
    assert connectors_given("delta,kafka") == frozenset({"delta", "kafka"})
    assert connectors_given("") == frozenset()
