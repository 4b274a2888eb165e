"""The environment each service of a compose file gets, checked against the stack's settings.

No Docker engine is needed: the file is read as ``docker compose`` reads it (YAML anchors and
merges, ``${VAR:-default}`` / ``${VAR:?error}`` from the shell and the ``.env`` beside the
file), each service's environment is what its image sets (``ENV`` of the Dockerfile it is built
from) under what the service sets, and every service that runs Primus Flow is checked:

- its settings are ones :meth:`StackConfig.from_env` accepts, naming external services (a
  container that started its own Kafka or MLflow would train alone);
- every storage root (warehouse, handoff, feature states, checkpoints) is in S3, since a
  container's own folders are not shared with the driver, the executors and the trainers;
- the S3 configuration is the same in every such service, its endpoint is a service of the
  file, the keys are the store's own, and the buckets are created by a service of the file;
- the hosts of Kafka, the catalog and MLflow are services of the file.

``flow compose check docker/compose.yaml`` prints the result (secrets hidden).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from flow.config import StackConfig, is_s3
from flow.errors import ConfigError
from flow.secrets import REDACTED, is_secret_key

__all__ = [
    "Service",
    "check",
    "compose_variables",
    "interpolate",
    "read_compose",
    "read_env_file",
    "render",
]

# $$, ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}, ${NAME:+alt},
# ${NAME+alt}, $NAME: compose's interpolation (https://docs.docker.com/compose/ "Interpolation").
_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>\w+)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}|(?P<plain>\w+))"
)

# Where S3-compatible stores started by a compose file keep their root keys: the credentials
# every client of that store must be given.
_STORE_KEYS = {"minio": ("MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD")}
_MAKE_BUCKET = re.compile(r"\bmc\s+mb\s+((?:\S+\s*)+?)(?:&&|;|\n|$)")
_ROOTS = ("FLOW_WAREHOUSE", "FLOW_HANDOFF", "FLOW_FEATURE_STATE", "FLOW_CHECKPOINTS")


def interpolate(text: str, variables: Mapping[str, str]) -> str:
    """``text`` with compose's variables replaced; an unset ``${X:?why}`` raises ConfigError."""

    def replace(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["braced"] or match["plain"]
        op, arg = match["op"] or "", match["arg"] or ""
        value = variables.get(name)
        # The colon forms treat an empty value as unset.
        unset = value is None or (op.startswith(":") and value == "")
        if op.endswith("-"):
            return arg if unset else str(value)
        if op.endswith("?"):
            if unset:
                raise ConfigError(f"{name}: {arg or 'required variable is not set'}")
            return str(value)
        if op.endswith("+"):
            return "" if unset else arg
        return value or ""

    return _VARIABLE.sub(replace, text)


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=value`` lines as compose reads a ``.env`` (comments, blank lines, quotes)."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        found[key.strip()] = value
    return found


def _interpolated(node: Any, variables: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, variables)
    if isinstance(node, list):
        return [_interpolated(item, variables) for item in node]
    if isinstance(node, dict):
        return {key: _interpolated(value, variables) for key, value in node.items()}
    return node


def read_compose(path: Path, variables: Mapping[str, str]) -> dict[str, Any]:
    """The compose file with its anchors merged and its variables replaced."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("services"), dict):
        raise ConfigError(f"{path} has no `services:` mapping; is it a compose file?")
    result: dict[str, Any] = _interpolated(data, variables)
    return result


def image_env(dockerfile: Path) -> dict[str, str]:
    """The ``ENV`` a Dockerfile sets (both ``ENV K=V ...`` and the old ``ENV K V`` form)."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    found: dict[str, str] = {}
    for line in text.splitlines():
        words = line.strip().split(maxsplit=1)
        if len(words) != 2 or words[0].upper() != "ENV":
            continue
        tokens = shlex.split(words[1])
        if tokens and "=" not in tokens[0]:
            found[tokens[0]] = " ".join(tokens[1:])
            continue
        for token in tokens:
            key, _, value = token.partition("=")
            found[key] = interpolate(value, found)
    return found


@dataclass(frozen=True)
class Service:
    """One service as a container of it would start."""

    name: str
    image: str
    environment: dict[str, str]
    """What the container's processes see: the image's ``ENV`` under the service's own."""
    own: frozenset[str] = field(default_factory=frozenset)
    """The variables the service sets itself (not only its image)."""
    command: list[str] = field(default_factory=list)
    entrypoint: list[str] | None = None
    """The service's own entry point (None: the image's)."""

    @property
    def runs_flow(self) -> bool:
        """Whether the service configures Primus Flow (sets a ``FLOW_*`` variable itself)."""
        return any(name.startswith("FLOW_") for name in self.own)

    def shown(self) -> dict[str, str]:
        """The environment with secrets hidden, for printing."""
        return {
            key: REDACTED if is_secret_key(key) else value
            for key, value in sorted(self.environment.items())
        }


def _environment(raw: Any, variables: Mapping[str, str]) -> dict[str, str]:
    """A service's ``environment:``, a mapping or a ``K=V`` list; a bare ``K`` is the shell's."""
    if raw is None:
        return {}
    if isinstance(raw, dict):
        pairs = [(str(key), None if value is None else str(value)) for key, value in raw.items()]
    else:
        # `K=V`, or a bare `K`: passed through from the shell (left out when it is unset).
        pairs = [(k, v if sep else None) for k, sep, v in (str(i).partition("=") for i in raw)]
    found: dict[str, str] = {}
    for key, value in pairs:
        taken = variables.get(key) if value is None else value
        if taken is not None:
            found[key] = taken
    return found


def _dockerfile(path: Path, service: Mapping[str, Any]) -> Path | None:
    build = service.get("build")
    if build is None:
        return None
    if isinstance(build, str):
        return (path.parent / build / "Dockerfile").resolve()
    context = path.parent / str(build.get("context", "."))
    return (context / str(build.get("dockerfile", "Dockerfile"))).resolve()


def _images(path: Path, services: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Each image the file builds, with its ``ENV`` (services share an image by its tag)."""
    found: dict[str, dict[str, str]] = {}
    for service in services.values():
        dockerfile = _dockerfile(path, service)
        if dockerfile is not None and dockerfile.is_file():
            found[str(service.get("image", dockerfile))] = image_env(dockerfile)
    return found


def _command(raw: Any) -> list[str]:
    if raw is None:
        return []
    return shlex.split(raw) if isinstance(raw, str) else [str(word) for word in raw]


def compose_variables(path: Path, env_file: Path | None = None) -> dict[str, str]:
    """compose's variables for the file at ``path``: ``env_file`` (default: the ``.env``
    beside it, if any) under the shell's."""
    env_file = env_file or path.parent / ".env"
    return {**(read_env_file(env_file) if env_file.is_file() else {}), **os.environ}


def render(path: Path, variables: Mapping[str, str] | None = None) -> list[Service]:
    """Every service of the compose file at ``path`` with the environment it would get.

    ``variables`` are compose's (default: :func:`compose_variables`).
    """
    if variables is None:
        variables = compose_variables(path)
    data = read_compose(path, variables)
    images = _images(path, data["services"])
    services = []
    for name, service in data["services"].items():
        image = str(service.get("image", name))
        own = {}
        for env_file in service.get("env_file") or []:
            own.update(read_env_file(path.parent / str(env_file)))
        own.update(_environment(service.get("environment"), variables))
        services.append(
            Service(
                name=str(name),
                image=image,
                environment={**images.get(image, {}), **own},
                own=frozenset(own),
                command=_command(service.get("command")),
                entrypoint=_command(service["entrypoint"]) if "entrypoint" in service else None,
            )
        )
    return services


def check(services: list[Service]) -> list[str]:
    """What is wrong with the services that run Primus Flow, one line each (none: fine)."""
    by_name = {service.name: service for service in services}
    flow = [service for service in services if service.runs_flow]
    if not flow:
        return ["no service sets a FLOW_* variable: nothing runs Primus Flow"]
    problems: list[str] = []
    stacks: dict[str, StackConfig] = {}
    for service in flow:
        try:
            stacks[service.name] = StackConfig.from_env(service.environment)
        except ConfigError as exc:
            problems.append(f"{service.name}: {exc}")
    for name, stack in stacks.items():
        problems += [f"{name}: {why}" for why in _stack_problems(stack, by_name)]
    problems += _shared_s3(stacks)
    problems += _buckets(stacks, services)
    return problems


def _roots(stack: StackConfig) -> dict[str, str]:
    values = (stack.catalog.warehouse, stack.handoff, stack.feature_state, stack.checkpoints)
    return dict(zip(_ROOTS, values, strict=True))


def _stack_problems(stack: StackConfig, services: Mapping[str, Service]) -> Iterator[str]:
    if stack.kafka.managed:
        yield "FLOW_KAFKA_BOOTSTRAP is unset: the container would start a broker of its own"
    if stack.mlflow.managed:
        yield "MLFLOW_TRACKING_URI is unset: the container would start an MLflow of its own"
    for setting, root in _roots(stack).items():
        if not is_s3(root):
            yield (
                f"{setting} is {root}, a folder of this container that no other container "
                f"sees; set it to an s3:// location in the compose's store"
            )
    hosts = {
        "FLOW_KAFKA_BOOTSTRAP": [
            address.rpartition(":")[0] for address in stack.kafka.bootstrap_servers.split(",")
        ],
        "FLOW_CATALOG_URI": [urlparse(stack.catalog.uri).hostname or ""],
        "MLFLOW_TRACKING_URI": [urlparse(stack.mlflow.tracking_uri).hostname or ""],
        "FLOW_S3_ENDPOINT": [urlparse(stack.s3.endpoint or "").hostname or ""],
    }
    for setting, names in hosts.items():
        for host in names:
            # A dotted host or an address is outside the file (a managed service, AWS itself).
            if host and "." not in host and host not in services:
                known = ", ".join(sorted(services))
                yield f"{setting} names host {host!r}, which is not a service ({known})"
    s3 = stack.s3
    if bool(s3.access_key) != bool(s3.secret_key):
        yield "give both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or neither"
    store = services.get(urlparse(s3.endpoint or "").hostname or "")
    kind = store.image.rsplit("/", 1)[-1].partition(":")[0] if store else ""
    keys = _STORE_KEYS.get(kind, ())
    if store is not None and keys:
        user, password = (store.environment.get(k) for k in keys)
        if (s3.access_key, s3.secret_key) != (user, password):
            yield (
                f"AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY are not {store.name}'s "
                f"{' / '.join(keys)}: its S3 requests would be refused"
            )


def _shared_s3(stacks: Mapping[str, StackConfig]) -> list[str]:
    """One S3 configuration for every service: an executor writes what a trainer reads."""
    seen: dict[tuple[Any, ...], list[str]] = {}
    for name, stack in stacks.items():
        s3 = stack.s3
        key = (s3.endpoint, s3.region, s3.path_style, s3.access_key, s3.secret_key)
        seen.setdefault(key, []).append(name)
    if len(seen) <= 1:
        return []
    groups = "; ".join(", ".join(names) for names in seen.values())
    return [
        f"the services do not share one S3 configuration (FLOW_S3_* / AWS_*): {groups}; "
        "give them all the same (a YAML anchor, as docker/compose.yaml does)"
    ]


def _buckets(stacks: Mapping[str, StackConfig], services: list[Service]) -> list[str]:
    """Buckets on a store of the file must be made by a service of it (``mc mb``)."""
    names = {service.name for service in services}
    made = {
        word.rpartition("/")[2]
        for service in services
        for match in _MAKE_BUCKET.finditer(" ".join(service.command))
        for word in match[1].split()
        if not word.startswith("-")
    }
    missing: dict[str, set[str]] = {}
    for stack in stacks.values():
        if urlparse(stack.s3.endpoint or "").hostname not in names:
            continue  # an external store: its buckets are its owner's
        for setting, root in _roots(stack).items():
            bucket = urlparse(root).netloc
            if is_s3(root) and bucket not in made:
                missing.setdefault(bucket, set()).add(setting)
    return [
        f"bucket {bucket!r} ({', '.join(sorted(settings))}) is created by no service; add it "
        "to the `mc mb` of the store's init service"
        for bucket, settings in sorted(missing.items())
    ]
