"""Where the stack lives: the typed settings every part of Primus Flow reads.

A :class:`StackConfig` is built from ``FLOW_*`` environment variables (and MLflow's own
``MLFLOW_TRACKING_URI``). Left unset, everything points at the embedded local stack in the state
folder ``FLOW_HOME`` (default ``./.flow``): a Kafka broker, an Iceberg SQL catalog on SQLite and an
MLflow server, all on 127.0.0.1. Set the variables to point the same code at production services
(see ``docker/compose.yaml``). A ``FLOW_*`` variable this module does not know is an error, so a
typo never silently falls back to a default.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from flow import versions
from flow.errors import ConfigError

__all__ = [
    "ENV_VARS",
    "CatalogConfig",
    "KafkaConfig",
    "MlflowConfig",
    "SparkConfig",
    "StackConfig",
]

LOOPBACK = "127.0.0.1"

#: Every variable :meth:`StackConfig.from_env` reads, with what it sets.
ENV_VARS: Mapping[str, str] = {
    "FLOW_HOME": "state folder of the local stack (default ./.flow)",
    "FLOW_JAR_CACHE": "where resolved JVM jars are kept (default $FLOW_HOME/jars)",
    "FLOW_MAVEN_REPO": f"Maven repository to resolve jars from (default {versions.MAVEN_CENTRAL})",
    "FLOW_OFFLINE": "1 to never contact the Maven repository (jars must be resolved already)",
    "FLOW_KAFKA_BOOTSTRAP": "bootstrap servers of an external Kafka (unset: the local broker)",
    "FLOW_KAFKA_PORT": "port of the local broker (default 19092)",
    "FLOW_KAFKA_CONTROLLER_PORT": "port of the local broker's KRaft controller (default 19093)",
    "FLOW_KAFKA_HEAP": "JVM heap of the local broker, e.g. 512m (default 512m)",
    "FLOW_CATALOG_NAME": "Iceberg catalog name shared by pyiceberg and Spark (default flow)",
    "FLOW_CATALOG_TYPE": "sql (local SQLite catalog, default) or rest",
    "FLOW_CATALOG_URI": "catalog URI: a SQLite file path for sql, an http(s) URL for rest",
    "FLOW_WAREHOUSE": "Iceberg warehouse location (default $FLOW_HOME/lake/warehouse)",
    "FLOW_CATALOG_PROPERTIES": "extra catalog properties, comma-separated key=value pairs",
    "FLOW_LAKE": "root of path-based Delta tables (default $FLOW_HOME/lake/delta)",
    "FLOW_FEATURE_STATE": "where fitted feature states go, path or URI ($FLOW_HOME/feature-state)",
    "FLOW_HANDOFF": "root of handoff locations, a path or URI (default $FLOW_HOME/handoff)",
    "FLOW_MLFLOW_PORT": "port of the local MLflow server (default 15000)",
    "MLFLOW_TRACKING_URI": "an external MLflow tracking server (unset: the local one)",
    "FLOW_PARENT_RUN_ID": "an MLflow run that pipeline and trainer runs nest under",
    "FLOW_SPARK_MASTER": "Spark master when not launched by spark-submit (default local[*])",
    "FLOW_SPARK_DRIVER_MEMORY": "driver memory of local Spark sessions (default 2g)",
}

_MEMORY = re.compile(r"^[1-9][0-9]*[kKmMgG]$")


def _port(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a port number; set it to 1024-65535") from None
    if not 1024 <= value <= 65535:
        raise ConfigError(f"{name}={value} is outside 1024-65535; choose an unprivileged port")
    return value


def _memory(env: Mapping[str, str], name: str, default: str) -> str:
    value = env.get(name) or default
    if not _MEMORY.match(value):
        raise ConfigError(f"{name}={value!r} is not a JVM memory size; use e.g. 512m or 2g")
    return value


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in ("", "0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    raise ConfigError(f"{name}={raw!r} is not a flag; use 1 or 0")


def _properties(env: Mapping[str, str], name: str) -> dict[str, str]:
    raw = env.get(name, "").strip()
    props: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{name}: {item!r} is not key=value; write e.g. s3.endpoint=http://x")
        props[key.strip()] = value.strip()
    return props


@dataclass(frozen=True)
class KafkaConfig:
    """The Kafka cluster pipelines read from and the local broker that stands in for it."""

    bootstrap_servers: str
    """``host:port`` list clients connect to."""
    managed: bool
    """True when this is the project's local broker (``flow services`` starts and stops it)."""
    port: int = 19092
    """Client port of the local broker (127.0.0.1 only)."""
    controller_port: int = 19093
    """KRaft controller port of the local broker (127.0.0.1 only)."""
    heap: str = "512m"
    """JVM heap of the local broker."""

    def __post_init__(self) -> None:
        if self.managed and self.port == self.controller_port:
            raise ConfigError(
                f"FLOW_KAFKA_PORT and FLOW_KAFKA_CONTROLLER_PORT are both {self.port}; "
                "the broker needs two different ports"
            )
        if not self.bootstrap_servers.strip():
            raise ConfigError("FLOW_KAFKA_BOOTSTRAP is empty; unset it or give host:port")


@dataclass(frozen=True)
class CatalogConfig:
    """The Iceberg catalog pyiceberg and Spark share: same name, same warehouse."""

    name: str
    """Catalog name, the first part of ``name.namespace.table`` in Spark SQL."""
    type: Literal["sql", "rest"]
    """``sql``: a SQLite file both engines open; ``rest``: an Iceberg REST catalog server."""
    uri: str
    """SQLite file path for ``sql``; base URL of the server for ``rest``."""
    warehouse: str
    """Where table data and metadata go: a ``file://`` URI or an object-store URI."""
    properties: Mapping[str, str] = field(default_factory=dict)
    """Extra properties handed to both engines unchanged (``s3.endpoint``, credentials, ...)."""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.name):
            raise ConfigError(
                f"FLOW_CATALOG_NAME={self.name!r} is not a SQL identifier; use letters, digits, _"
            )
        if self.name == "spark_catalog":
            raise ConfigError(
                "FLOW_CATALOG_NAME=spark_catalog is taken by Delta's session catalog; pick another"
            )
        if self.type == "rest" and not self.uri.startswith(("http://", "https://")):
            raise ConfigError(f"FLOW_CATALOG_URI={self.uri!r}: a rest catalog needs an http(s) URL")

    @property
    def sqlite_path(self) -> Path:
        """The SQLite file of a ``sql`` catalog."""
        if self.type != "sql":
            raise ConfigError(f"catalog {self.name!r} is a {self.type} catalog, not a SQLite one")
        return Path(self.uri)


@dataclass(frozen=True)
class MlflowConfig:
    """Where runs are tracked, and the local server that stands in for a shared one."""

    tracking_uri: str
    """What clients use (``MLFLOW_TRACKING_URI``)."""
    managed: bool
    """True when this is the project's local MLflow server."""
    port: int = 15000
    """Port of the local server (127.0.0.1 only)."""
    backend_store: Path = Path("mlflow.db")
    """SQLite file of the local server's store (unused when ``managed`` is False)."""
    artifacts: Path = Path("artifacts")
    """Artifact folder of the local server (unused when ``managed`` is False)."""


@dataclass(frozen=True)
class SparkConfig:
    """Defaults for Spark sessions started outside spark-submit."""

    master: str = "local[*]"
    """Master URL when the job is not launched by spark-submit (which brings its own)."""
    driver_memory: str = "2g"
    """Driver memory for sessions this project launches."""


@dataclass(frozen=True)
class StackConfig:
    """The whole stack: state folder, jars, Kafka, Iceberg, Delta lake root, MLflow, Spark."""

    home: Path
    """State folder of the local stack: service data, logs, checkpoints."""
    jar_cache: Path
    """Resolved JVM jars and the Ivy cache."""
    maven_repo: str
    """Maven repository URL jars come from."""
    offline: bool
    """Never contact the Maven repository."""
    kafka: KafkaConfig
    catalog: CatalogConfig
    mlflow: MlflowConfig
    spark: SparkConfig
    lake: Path
    """Root folder of path-based Delta tables."""
    feature_state: str
    """Where fitted feature states are saved and loaded: a path or a pyarrow.fs URI."""
    handoff: str
    """Root of handoff locations (one per pipeline namespace): a path or a pyarrow.fs URI."""

    @property
    def services_dir(self) -> Path:
        """Where local services keep their data, logs and process records."""
        return self.home / "services"

    @property
    def checkpoints(self) -> Path:
        """Structured Streaming checkpoints, one folder per query."""
        return self.home / "checkpoints"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> StackConfig:
        """Read the stack from the environment (``os.environ`` by default)."""
        env = os.environ if env is None else env
        unknown = sorted(k for k in env if k.startswith("FLOW_") and k not in ENV_VARS)
        if unknown:
            known = ", ".join(k for k in ENV_VARS if k.startswith("FLOW_"))
            raise ConfigError(
                f"unknown setting(s) {', '.join(unknown)}; Primus Flow reads: {known}"
            )

        home = Path(env.get("FLOW_HOME") or ".flow").expanduser().resolve()
        jar_cache = Path(env.get("FLOW_JAR_CACHE") or home / "jars").expanduser().resolve()
        maven_repo = env.get("FLOW_MAVEN_REPO") or versions.MAVEN_CENTRAL
        if not maven_repo.endswith("/"):
            maven_repo += "/"

        kafka_port = _port(env, "FLOW_KAFKA_PORT", 19092)
        external_kafka = env.get("FLOW_KAFKA_BOOTSTRAP", "")
        kafka = KafkaConfig(
            bootstrap_servers=external_kafka or f"{LOOPBACK}:{kafka_port}",
            managed=not external_kafka,
            port=kafka_port,
            controller_port=_port(env, "FLOW_KAFKA_CONTROLLER_PORT", 19093),
            heap=_memory(env, "FLOW_KAFKA_HEAP", "512m"),
        )

        catalog_type = env.get("FLOW_CATALOG_TYPE") or "sql"
        if catalog_type not in ("sql", "rest"):
            raise ConfigError(f"FLOW_CATALOG_TYPE={catalog_type!r}; use sql or rest")
        lake_root = home / "lake"
        if catalog_type == "sql":
            uri = str(Path(env.get("FLOW_CATALOG_URI") or lake_root / "catalog.db").resolve())
        else:
            uri = env.get("FLOW_CATALOG_URI", "")
            if not uri:
                raise ConfigError("FLOW_CATALOG_TYPE=rest needs FLOW_CATALOG_URI (the server URL)")
        warehouse = env.get("FLOW_WAREHOUSE") or (lake_root / "warehouse").as_uri()
        if "://" not in warehouse:
            warehouse = Path(warehouse).resolve().as_uri()
        catalog = CatalogConfig(
            name=env.get("FLOW_CATALOG_NAME") or "flow",
            type="sql" if catalog_type == "sql" else "rest",
            uri=uri,
            warehouse=warehouse,
            properties=_properties(env, "FLOW_CATALOG_PROPERTIES"),
        )

        mlflow_port = _port(env, "FLOW_MLFLOW_PORT", 15000)
        external_mlflow = env.get("MLFLOW_TRACKING_URI", "")
        mlflow_dir = home / "services" / "mlflow"
        mlflow = MlflowConfig(
            tracking_uri=external_mlflow or f"http://{LOOPBACK}:{mlflow_port}",
            managed=not external_mlflow,
            port=mlflow_port,
            backend_store=mlflow_dir / "mlflow.db",
            artifacts=mlflow_dir / "artifacts",
        )

        spark = SparkConfig(
            master=env.get("FLOW_SPARK_MASTER") or "local[*]",
            driver_memory=_memory(env, "FLOW_SPARK_DRIVER_MEMORY", "2g"),
        )
        ports = [kafka.port, kafka.controller_port] if kafka.managed else []
        if mlflow.managed:
            ports.append(mlflow.port)
        if len(set(ports)) != len(ports):
            raise ConfigError(
                f"local services would share a port ({ports}); give FLOW_KAFKA_PORT, "
                "FLOW_KAFKA_CONTROLLER_PORT and FLOW_MLFLOW_PORT different values"
            )
        return cls(
            home=home,
            jar_cache=jar_cache,
            maven_repo=maven_repo,
            offline=_flag(env, "FLOW_OFFLINE"),
            kafka=kafka,
            catalog=catalog,
            mlflow=mlflow,
            spark=spark,
            lake=Path(env.get("FLOW_LAKE") or lake_root / "delta").expanduser().resolve(),
            feature_state=env.get("FLOW_FEATURE_STATE") or str(home / "feature-state"),
            handoff=env.get("FLOW_HANDOFF") or str(home / "handoff"),
        )
