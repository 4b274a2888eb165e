from __future__ import annotations

from pathlib import Path

import pytest

from flow.config import ENV_VARS, StackConfig
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


def test_an_explicit_mapping_is_the_whole_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOW_KAFKA_PORT", "not a port")
    monkeypatch.setenv("FLOW_HOME", str(tmp_path / "from-os-environ"))
    stack = StackConfig.from_env({"FLOW_HOME": str(tmp_path)})
    assert stack.home == tmp_path.resolve()
    assert stack.kafka.port == 19092


def test_without_a_mapping_the_process_environment_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLOW_HOME", str(tmp_path))
    monkeypatch.setenv("FLOW_KAFKA_PORT", "20001")
    monkeypatch.setenv("FLOW_OFFLINE", "true")
    stack = StackConfig.from_env()
    assert stack.home == tmp_path.resolve()
    assert stack.kafka.bootstrap_servers == "127.0.0.1:20001"
    assert stack.offline


def test_an_empty_variable_means_its_default(tmp_path: Path) -> None:
    stack = StackConfig.from_env(
        {"FLOW_HOME": str(tmp_path), "FLOW_KAFKA_PORT": "", "FLOW_LAKE": "", "FLOW_OFFLINE": ""}
    )
    assert stack.kafka.port == 19092
    assert stack.lake == tmp_path.resolve() / "lake" / "delta"
    assert not stack.offline


def test_every_bad_variable_is_named_in_one_config_error() -> None:
    with pytest.raises(ConfigError) as caught:
        StackConfig.from_env(
            {"FLOW_OFFLINE": "maybe", "FLOW_MLFLOW_PORT": "99999", "FLOW_SPARK_DRIVER_MEMORY": "2"}
        )
    lines = str(caught.value).splitlines()
    assert lines == [
        "FLOW_OFFLINE='maybe' is not a flag; use 1 or 0",
        "FLOW_MLFLOW_PORT=99999 is outside 1024-65535; choose an unprivileged port",
        "FLOW_SPARK_DRIVER_MEMORY='2' is not a JVM memory size; use e.g. 512m or 2g",
    ]


def test_only_the_exact_variable_names_are_read(tmp_path: Path) -> None:
    stack = StackConfig.from_env({"FLOW_HOME": str(tmp_path), "flow_kafka_port": "20002"})
    assert stack.kafka.port == 19092


def test_every_variable_is_listed_with_what_it_sets() -> None:
    assert "FLOW_KAFKA_PORT" in ENV_VARS
    assert "MLFLOW_TRACKING_URI" in ENV_VARS
    assert all(description for description in ENV_VARS.values())
