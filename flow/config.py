"""Where the stack lives: the typed settings every part of Primus Flow reads.

A :class:`StackConfig` is built from ``FLOW_*`` environment variables (and MLflow's own
``MLFLOW_TRACKING_URI``). Left unset, everything points at the embedded local stack in the state
folder ``FLOW_HOME`` (default ``./.flow``): a Kafka broker, an Iceberg SQL catalog on SQLite and an
MLflow server, all on 127.0.0.1. Set the variables to point the same code at production services
(see ``docker/compose.yaml``). A ``FLOW_*`` variable this module does not know is an error, so a
typo never silently falls back to a default.

The variables are read by pydantic-settings (:class:`_Environment`, one typed field per variable)
rather than by hand: the names, types, defaults and "empty means unset" are declared once, and the
same declaration yields :data:`ENV_VARS`. What stays ours is what users see: every validation
error becomes a :class:`ConfigError` that names the variable and the fix, and the settings that
depend on each other are checked in :meth:`StackConfig.from_env` and the configs it builds.

(Past 400 lines because every setting is declared here once, with its docstring: splitting the
declaration would split what ``ENV_VARS`` and the docs are generated from.)
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import AliasGenerator, BeforeValidator, Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from flow import versions
from flow.errors import ConfigError
from flow.secrets import is_secret_key

__all__ = [
    "AWS_VARS",
    "BENCH_RESULT_ENV",
    "ENV_VARS",
    "RUN_RESULT_ENV",
    "CatalogConfig",
    "KafkaConfig",
    "MlflowConfig",
    "S3Config",
    "SparkConfig",
    "StackConfig",
]

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, eq=False)  # hashed by identity: typing hashes the Annotated it is in
class _Says:
    """What a bad value of a variable says, by pydantic's error type.

    Templates get ``variable`` (its name), ``value`` (the text it held) and ``reason`` (a
    validator's own message).
    """

    messages: Mapping[str, str]


def _key_values(raw: object) -> object:
    if not isinstance(raw, str):
        return raw
    props: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            # Not shown when it may be (part of) a credential.
            shown = "an item naming a secret" if is_secret_key(item) else repr(item)
            raise ValueError(f"{shown} is not key=value; write e.g. s3.endpoint=http://x")
        props[key.strip()] = value.strip()
    return props


_OUTSIDE = "{variable}={value} is outside 1024-65535; choose an unprivileged port"
_Port = Annotated[
    int,
    Field(ge=1024, le=65535),
    _Says(
        {
            "int_parsing": "{variable}={value!r} is not a port number; set it to 1024-65535",
            "greater_than_equal": _OUTSIDE,
            "less_than_equal": _OUTSIDE,
        }
    ),
]
_NOT_MEMORY = "{variable}={value!r} is not a JVM memory size; use e.g. 512m or 2g"
_Memory = Annotated[
    str, Field(pattern=r"^[1-9][0-9]*[kKmMgG]$"), _Says({"string_pattern_mismatch": _NOT_MEMORY})
]
_Flag = Annotated[bool, _Says({"bool_parsing": "{variable}={value!r} is not a flag; use 1 or 0"})]
_CatalogType = Annotated[
    Literal["sql", "rest"], _Says({"literal_error": "{variable}={value!r}; use sql or rest"})
]
# NoDecode: pydantic-settings would read a dict-typed variable as JSON; ours is k=v,k=v.
_Properties = Annotated[
    dict[str, str],
    NoDecode,
    BeforeValidator(_key_values),
    _Says({"value_error": "{variable}: {reason}"}),
]


class _Environment(BaseSettings):
    """One field per variable; its docstring is the variable's line in :data:`ENV_VARS`."""

    model_config = SettingsConfigDict(
        # FLOW_KAFKA_PORT for kafka_port, exactly: a lower-case flow_kafka_port is not ours.
        alias_generator=AliasGenerator(validation_alias=lambda name: f"FLOW_{name.upper()}"),
        case_sensitive=True,
        # `FLOW_LAKE= flow run ...` (set but empty) means the default, as it always has.
        env_ignore_empty=True,
        use_attribute_docstrings=True,
        # The chained ValidationError would print FLOW_CATALOG_PROPERTIES, credentials and all.
        hide_input_in_errors=True,
        frozen=True,
    )

    home: Path = Path(".flow")
    """state folder of the local stack (default ./.flow)"""
    jar_cache: Path | None = None
    """where resolved JVM jars are kept (default $FLOW_HOME/jars)"""
    maven_repo: str = versions.MAVEN_CENTRAL
    """Maven repository to resolve jars from (default Maven Central)"""
    offline: _Flag = False
    """1 to never contact the Maven repository (jars must be resolved already)"""
    kafka_bootstrap: str | None = None
    """bootstrap servers of an external Kafka (unset: the local broker)"""
    kafka_port: _Port = 19092
    """port of the local broker (default 19092)"""
    kafka_controller_port: _Port = 19093
    """port of the local broker's KRaft controller (default 19093)"""
    kafka_heap: _Memory = "512m"
    """JVM heap of the local broker, e.g. 512m (default 512m)"""
    catalog_name: str = "flow"
    """Iceberg catalog name shared by pyiceberg and Spark (default flow)"""
    catalog_type: _CatalogType = "sql"
    """sql (local SQLite catalog, default) or rest"""
    catalog_uri: str | None = None
    """catalog URI: a SQLite file path for sql, an http(s) URL for rest"""
    warehouse: str | None = None
    """Iceberg warehouse location (default $FLOW_HOME/lake/warehouse)"""
    catalog_properties: _Properties = {}
    """extra catalog properties, comma-separated key=value pairs"""
    lake: Path | None = None
    """root of path-based Delta tables (default $FLOW_HOME/lake/delta)"""
    feature_state: str | None = None
    """where fitted feature states go, path or URI ($FLOW_HOME/feature-state)"""
    handoff: str | None = None
    """root of handoff locations, a path or URI (default $FLOW_HOME/handoff)"""
    checkpoints: str | None = None
    """streaming and trainer checkpoints, a path or URI (default: beside FLOW_HANDOFF when that
    is remote, else $FLOW_HOME/checkpoints)"""
    s3_endpoint: str | None = None
    """S3-compatible endpoint URL for every s3:// location, e.g. http://127.0.0.1:9000 (default:
    AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else AWS itself)"""
    s3_region: str | None = None
    """region of the S3 buckets (default: AWS_REGION, AWS_DEFAULT_REGION, else us-east-1)"""
    s3_path_style: _Flag | None = None
    """1: bucket in the URL path (MinIO, Ceph, moto); 0: virtual-hosted (default: 1 when an
    endpoint is set)"""
    mlflow_port: _Port = 15000
    """port of the local MLflow server (default 15000)"""
    mlflow_tracking_uri: str | None = Field(None, validation_alias="MLFLOW_TRACKING_URI")
    """an external MLflow tracking server (unset: the local one)"""
    # Read where runs start (flow.tracking), not here; declared so that it is a known variable.
    parent_run_id: str | None = None
    """an MLflow run that pipeline and trainer runs nest under"""
    spark_master: str = "local[*]"
    """Spark master when not launched by spark-submit (default local[*])"""
    spark_driver_memory: _Memory = "2g"
    """driver memory of local Spark sessions (default 2g)"""
    spark_cds: _Flag = True
    """1 (default): Spark drivers map a class archive the first job made (seconds off each
    start); 0: never"""
    # Written by `flow run --json` and `flow bench --json` for their child, read where the
    # result is written (flow.pipeline.run, benchmarks/_results.py); declared so they are known.
    run_result: Path | None = None
    """a file a pipeline run writes its outcome to as JSON: its MLflow run, each stage's counts
    (`flow run --json` sets it)"""
    bench_result: Path | None = None
    """a file a benchmark writes its result to as JSON, besides $FLOW_HOME/bench
    (`flow bench --json` sets it)"""
    # Read where errors are reported (flow.console), not here: it must work when the other
    # settings are what is wrong. Declared so that it is a known variable.
    debug: _Flag = False
    """1 to show the traceback of an error, not only its one-line message (as --debug does)"""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Only what read() hands over, from the mapping it was given: no .env file, no secrets
        # folder, and no os.environ behind a test's explicit dict.
        return (init_settings,)

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> _Environment:
        """The settings in ``environ``; a :class:`ConfigError` naming each bad variable."""
        try:
            return cls(**_MappingSource(cls, environ)())
        except ValidationError as exc:
            raise _config_error(exc) from exc


class _MappingSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping rather than os.environ."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # The hook pydantic-settings' own sources (AWS, Azure, GCP) override to read elsewhere.
        return {k: v for k, v in self._environ.items() if not (self.env_ignore_empty and v == "")}


def _variable(name: str) -> str:
    return str(_Environment.model_fields[name].validation_alias)


#: Every variable :meth:`StackConfig.from_env` reads, with what it sets.
ENV_VARS: Mapping[str, str] = {
    _variable(name): info.description or "" for name, info in _Environment.model_fields.items()
}
RUN_RESULT_ENV = _variable("run_result")
"""Where ``flow run --json`` asks a pipeline run to write its outcome (JSON)."""
BENCH_RESULT_ENV = _variable("bench_result")
"""Where ``flow bench --json`` asks a benchmark to write its result (JSON)."""
_FIELD_OF = {_variable(name): name for name in _Environment.model_fields}


def _says_of(name: str) -> _Says:
    """The field's :class:`_Says`, also from inside an optional type (``_Flag | None``)."""
    field_info = _Environment.model_fields[name]
    inner = (getattr(arg, "__metadata__", ()) for arg in get_args(field_info.annotation))
    found = [*field_info.metadata, *(m for metadata in inner for m in metadata)]
    return next((m for m in found if isinstance(m, _Says)), _Says({}))


def _config_error(error: ValidationError) -> ConfigError:
    """pydantic's report as our message: each bad variable by name, with what to write."""
    lines = []
    for problem in error.errors():
        name = _FIELD_OF.get(str(problem["loc"][0]), str(problem["loc"][0]))
        says = _says_of(name)
        context: Mapping[str, Any] = problem.get("ctx") or {}
        template = says.messages.get(problem["type"], "{variable}={value!r}: {reason}")
        lines.append(
            template.format(
                variable=_variable(name),
                value=problem["input"],
                reason=context.get("error", problem["msg"]),
            )
        )
    return ConfigError("\n".join(lines))


#: The standard AWS variables :class:`S3Config` reads (as every AWS SDK does), with what they set.
AWS_VARS: Mapping[str, str] = {
    "AWS_ACCESS_KEY_ID": "access key of every s3:// location (unset: the SDKs' default chain)",
    "AWS_SECRET_ACCESS_KEY": "its secret",
    "AWS_SESSION_TOKEN": "a session token, for temporary credentials",
    "AWS_REGION": "region, when FLOW_S3_REGION is unset (also AWS_DEFAULT_REGION)",
    "AWS_ENDPOINT_URL": "endpoint, when FLOW_S3_ENDPOINT is unset (also AWS_ENDPOINT_URL_S3)",
}
_S3_SCHEMES = ("s3://", "s3a://", "s3n://")


def is_s3(uri: str) -> bool:
    """Whether ``uri`` names an object in S3 (or an S3-compatible store)."""
    return uri.startswith(_S3_SCHEMES)


@dataclass(frozen=True)
class S3Config:
    """One S3 configuration for every ``s3://`` location: the warehouse (pyiceberg and Spark's
    S3FileIO), the handoff and feature states (pyarrow), checkpoints (Spark's S3A and pyarrow)
    and the executors (their environment). Credentials unset: each SDK's default chain (an AWS
    profile, an instance role) finds them."""

    endpoint: str | None = None
    """Endpoint URL with its scheme (``http://127.0.0.1:9000``); None: AWS's own."""
    region: str = "us-east-1"
    path_style: bool = False
    """Bucket in the URL path rather than in the host name (what S3-compatible servers want)."""
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.endpoint is not None and not self.endpoint.startswith(("http://", "https://")):
            raise ConfigError(
                f"FLOW_S3_ENDPOINT={self.endpoint!r} has no scheme; write "
                f"http://{self.endpoint} or https://{self.endpoint}"
            )
        if (self.access_key is None) != (self.secret_key is None):
            given, missing = (
                ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
                if self.secret_key is None
                else ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID")
            )
            raise ConfigError(f"{given} is set but {missing} is not; set both or neither")

    @property
    def endpoint_host(self) -> str | None:
        """``host:port`` of the endpoint (what pyarrow's ``endpoint_override`` takes)."""
        return self.endpoint.split("://", 1)[1].rstrip("/") if self.endpoint else None

    @property
    def scheme(self) -> str:
        return self.endpoint.split("://", 1)[0] if self.endpoint else "https"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> S3Config:
        """The S3 settings in ``env``: ``FLOW_S3_*`` first, then the standard AWS variables."""

        def first(*names: str) -> str | None:
            return next((env[n] for n in names if env.get(n)), None)

        settings = _Environment.read({k: v for k, v in env.items() if k.startswith("FLOW_S3_")})
        endpoint = settings.s3_endpoint or first("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
        path_style = settings.s3_path_style
        return cls(
            endpoint=endpoint,
            region=settings.s3_region or first("AWS_REGION", "AWS_DEFAULT_REGION") or "us-east-1",
            path_style=bool(endpoint) if path_style is None else path_style,
            access_key=first("AWS_ACCESS_KEY_ID"),
            secret_key=first("AWS_SECRET_ACCESS_KEY"),
            session_token=first("AWS_SESSION_TOKEN"),
        )

    def environment(self) -> dict[str, str]:
        """The variables that give another process (an executor) this configuration."""
        values = {
            "FLOW_S3_ENDPOINT": self.endpoint,
            "FLOW_S3_REGION": self.region,
            "FLOW_S3_PATH_STYLE": "1" if self.path_style else "0",
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_SESSION_TOKEN": self.session_token,
        }
        return {k: v for k, v in values.items() if v is not None}


def _beside(root: str, name: str) -> str:
    """The folder ``name`` next to ``root`` (a URI), or in it when ``root`` is a bucket."""
    base, sep, query = root.partition("?")
    scheme, _, path = base.rstrip("/").partition("://")
    parent, slash, _ = path.rpartition("/")
    where = f"{parent}/{name}" if slash else f"{path}/{name}"
    return f"{scheme}://{where}{sep}{query}"


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
    properties: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Extra properties handed to both engines unchanged (``s3.endpoint``, credentials, ...);
    left out of ``repr`` for the credentials."""
    s3: S3Config = field(default_factory=lambda: S3Config(), repr=False)
    """The stack's S3 settings, for a warehouse in S3 (``properties`` win over them)."""

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
    cds: bool = True
    """Drivers started by ``flow submit`` map a class-data-sharing archive (spark_jobs.cds)."""


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
    checkpoints: str
    """Root of streaming queries' and trainers' checkpoints: a path or a URI (on a cluster,
    storage the driver and every worker share)."""
    checkpoints_from: str = "FLOW_CHECKPOINTS"
    """The setting that chose ``checkpoints``, as an error names it: ``FLOW_CHECKPOINTS``, or
    while that is unset the root it defaults beside (an error must not blame a setting the user
    never gave)."""

    @property
    def s3(self) -> S3Config:
        """Endpoint, region and credentials of every ``s3://`` location."""
        return self.catalog.s3

    @property
    def services_dir(self) -> Path:
        """Where local services keep their data, logs and process records."""
        return self.home / "services"

    @property
    def uses_s3(self) -> bool:
        """Whether any of the stack's locations is in S3 (Spark then needs the S3 jars)."""
        roots = (self.catalog.warehouse, self.handoff, self.checkpoints, self.feature_state)
        return any(is_s3(root) for root in roots)

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
        settings = _Environment.read(env)

        home = settings.home.expanduser().resolve()
        jar_cache = (settings.jar_cache or home / "jars").expanduser().resolve()
        maven_repo = settings.maven_repo
        if not maven_repo.endswith("/"):
            maven_repo += "/"

        external_kafka = settings.kafka_bootstrap or ""
        kafka = KafkaConfig(
            bootstrap_servers=external_kafka or f"{LOOPBACK}:{settings.kafka_port}",
            managed=not external_kafka,
            port=settings.kafka_port,
            controller_port=settings.kafka_controller_port,
            heap=settings.kafka_heap,
        )

        lake_root = home / "lake"
        if settings.catalog_type == "sql":
            uri = str(Path(settings.catalog_uri or lake_root / "catalog.db").resolve())
        else:
            uri = settings.catalog_uri or ""
            if not uri:
                raise ConfigError("FLOW_CATALOG_TYPE=rest needs FLOW_CATALOG_URI (the server URL)")
        warehouse = settings.warehouse or (lake_root / "warehouse").as_uri()
        if "://" not in warehouse:
            warehouse = Path(warehouse).resolve().as_uri()
        catalog = CatalogConfig(
            name=settings.catalog_name,
            type=settings.catalog_type,
            uri=uri,
            warehouse=warehouse,
            properties=settings.catalog_properties,
            s3=S3Config.from_env(env),
        )

        external_mlflow = settings.mlflow_tracking_uri or ""
        mlflow_dir = home / "services" / "mlflow"
        mlflow = MlflowConfig(
            tracking_uri=external_mlflow or f"http://{LOOPBACK}:{settings.mlflow_port}",
            managed=not external_mlflow,
            port=settings.mlflow_port,
            backend_store=mlflow_dir / "mlflow.db",
            artifacts=mlflow_dir / "artifacts",
        )

        spark = SparkConfig(
            master=settings.spark_master,
            driver_memory=settings.spark_driver_memory,
            cds=settings.spark_cds,
        )
        ports = [kafka.port, kafka.controller_port] if kafka.managed else []
        if mlflow.managed:
            ports.append(mlflow.port)
        if len(set(ports)) != len(ports):
            raise ConfigError(
                f"local services would share a port ({ports}); give FLOW_KAFKA_PORT, "
                "FLOW_KAFKA_CONTROLLER_PORT and FLOW_MLFLOW_PORT different values"
            )
        handoff = settings.handoff or str(home / "handoff")
        checkpoints_from = "FLOW_CHECKPOINTS"
        if settings.checkpoints:
            checkpoints = settings.checkpoints
        elif "://" in handoff and not handoff.startswith("file:"):
            checkpoints = _beside(handoff, "checkpoints")
            checkpoints_from = "FLOW_CHECKPOINTS (unset: beside FLOW_HANDOFF)"
        else:
            checkpoints = str(home / "checkpoints")
            checkpoints_from = "FLOW_CHECKPOINTS (unset: in FLOW_HOME)"
        return cls(
            home=home,
            jar_cache=jar_cache,
            maven_repo=maven_repo,
            offline=settings.offline,
            kafka=kafka,
            catalog=catalog,
            mlflow=mlflow,
            spark=spark,
            lake=(settings.lake or lake_root / "delta").expanduser().resolve(),
            feature_state=settings.feature_state or str(home / "feature-state"),
            handoff=handoff,
            checkpoints=checkpoints,
            checkpoints_from=checkpoints_from,
        )
