from __future__ import annotations

from pathlib import Path

import pytest

from flow.config import StackConfig
from flow.errors import ConfigError


def test_defaults_point_at_the_local_stack_on_loopback(tmp_path: Path) -> None:
    stack = StackConfig.from_env({"FLOW_HOME": str(tmp_path)})
    assert stack.home == tmp_path.resolve()
    assert stack.kafka.managed
    assert stack.kafka.bootstrap_servers == "127.0.0.1:19092"
    assert stack.mlflow.managed
    assert stack.mlflow.tracking_uri == "http://127.0.0.1:15000"
    assert stack.catalog.type == "sql"
    assert stack.catalog.sqlite_path == tmp_path.resolve() / "lake" / "catalog.db"
    assert stack.catalog.warehouse == (tmp_path.resolve() / "lake" / "warehouse").as_uri()
    assert stack.jar_cache == tmp_path.resolve() / "jars"
    assert stack.spark.master == "local[*]"
    assert not stack.offline


def test_an_unknown_flow_setting_is_an_error_that_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"FLOW_KAFKA_PROT.*FLOW_KAFKA_PORT"):
        StackConfig.from_env({"FLOW_KAFKA_PROT": "9092"})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FLOW_KAFKA_PORT": "ninety"}, "FLOW_KAFKA_PORT='ninety' is not a port"),
        ({"FLOW_KAFKA_PORT": "80"}, "FLOW_KAFKA_PORT=80 is outside 1024-65535"),
        ({"FLOW_KAFKA_PORT": "20000", "FLOW_MLFLOW_PORT": "20000"}, "would share a port"),
        ({"FLOW_KAFKA_PORT": "20000", "FLOW_KAFKA_CONTROLLER_PORT": "20000"}, "two different"),
        ({"FLOW_KAFKA_HEAP": "lots"}, "FLOW_KAFKA_HEAP='lots' is not a JVM memory size"),
        ({"FLOW_OFFLINE": "maybe"}, "FLOW_OFFLINE='maybe' is not a flag"),
        ({"FLOW_CATALOG_TYPE": "hive"}, "FLOW_CATALOG_TYPE='hive'; use sql or rest"),
        ({"FLOW_CATALOG_TYPE": "rest"}, "needs FLOW_CATALOG_URI"),
        ({"FLOW_CATALOG_TYPE": "rest", "FLOW_CATALOG_URI": "thrift://x"}, "needs an http"),
        ({"FLOW_CATALOG_NAME": "my-catalog"}, "not a SQL identifier"),
        ({"FLOW_CATALOG_NAME": "spark_catalog"}, "taken by Delta"),
        ({"FLOW_CATALOG_PROPERTIES": "s3.endpoint"}, "is not key=value"),
    ],
)
def test_bad_settings_name_the_variable_and_the_fix(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        StackConfig.from_env(env)


def test_external_services_are_not_managed() -> None:
    stack = StackConfig.from_env(
        {
            "FLOW_KAFKA_BOOTSTRAP": "kafka:9092",
            "MLFLOW_TRACKING_URI": "http://mlflow:5000",
            "FLOW_CATALOG_TYPE": "rest",
            "FLOW_CATALOG_URI": "http://iceberg-rest:8181",
            "FLOW_WAREHOUSE": "s3://warehouse/",
            "FLOW_CATALOG_PROPERTIES": "s3.endpoint=http://minio:9000, s3.path-style-access=true",
        }
    )
    assert not stack.kafka.managed
    assert stack.kafka.bootstrap_servers == "kafka:9092"
    assert not stack.mlflow.managed
    assert stack.catalog.type == "rest"
    assert stack.catalog.warehouse == "s3://warehouse/"
    assert dict(stack.catalog.properties) == {
        "s3.endpoint": "http://minio:9000",
        "s3.path-style-access": "true",
    }
    with pytest.raises(ConfigError, match="not a SQLite one"):
        _ = stack.catalog.sqlite_path


def test_a_relative_warehouse_path_becomes_a_file_uri(tmp_path: Path) -> None:
    stack = StackConfig.from_env({"FLOW_WAREHOUSE": str(tmp_path / "wh")})
    assert stack.catalog.warehouse == (tmp_path / "wh").as_uri()
