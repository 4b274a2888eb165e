"""docker/: no Docker engine runs here, so check what can be checked without one.

The compose file parses, names every part of the production-shaped stack, references only
pinned images, publishes ports on 127.0.0.1 only and gives the trainer a GPU; every image's
entry point exists in this project. Its storage and settings are checked in test_compose_env.py.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import REPO

DOCKER = REPO / "docker"
PINNED = re.compile(r"^[\w./-]+:(?!latest$)[\w.-]*\d[\w.-]*$")


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def _services() -> dict[str, dict[str, Any]]:
    services = _compose()["services"]
    assert isinstance(services, dict)
    return services


def _dockerfile(service: dict[str, Any]) -> Path:
    build = service["build"]
    return Path(DOCKER, str(build["context"]), str(build["dockerfile"])).resolve()


def test_the_stack_has_every_production_part() -> None:
    assert {
        "kafka",
        "iceberg-rest",
        "minio",
        "mlflow",
        "postgres",
        "spark-master",
        "spark-worker",
        "trainer",
    } <= set(_services())


@pytest.mark.parametrize("name", sorted(_services()))
def test_images_are_pinned(name: str) -> None:
    service = _services()[name]
    assert PINNED.match(service["image"]), f"{name}: {service['image']} is not a pinned tag"
    if "build" in service:
        dockerfile = _dockerfile(service)
        assert dockerfile.is_file()
        for base in re.findall(r"^FROM\s+(\S+)", dockerfile.read_text(), re.MULTILINE):
            assert PINNED.match(base), f"{dockerfile.name}: FROM {base} is not pinned"


def test_published_ports_bind_to_loopback_only() -> None:
    for name, service in _services().items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on all interfaces"


def test_the_trainer_reserves_a_gpu() -> None:
    devices = _services()["trainer"]["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] for d in devices)


def _entry_points(service: dict[str, Any]) -> list[str]:
    """The command a container of ``service`` runs, tini stripped."""
    if "entrypoint" in service:
        argv = list(service["entrypoint"])
    else:
        text = _dockerfile(service).read_text()
        argv = yaml.safe_load(re.findall(r"^ENTRYPOINT\s+(\[.*\])", text, re.MULTILINE)[-1])
    return argv[2:] if argv[:2] == ["tini", "--"] else argv


def test_every_entry_point_of_our_images_exists() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    venv_bin = Path(sys.executable).parent
    for name, service in _services().items():
        if not service["image"].startswith("primus-flow/"):
            continue
        argv = _entry_points(service)
        if argv[:2] == ["python", "-m"]:
            assert (REPO / argv[2] / "__main__.py").is_file(), f"{name}: no module {argv[2]}"
        elif argv[0] in scripts:
            continue
        else:
            # Installed by a dependency (spark-class by pyspark, mlflow by MLflow).
            assert (venv_bin / argv[0]).exists(), f"{name}: {argv[0]} is not installed"


def test_every_file_the_dockerfiles_copy_exists() -> None:
    for dockerfile in DOCKER.glob("*.Dockerfile"):
        for line in re.findall(r"^COPY\s+(.+)$", dockerfile.read_text(), re.MULTILINE):
            for source in line.split()[:-1]:
                assert (REPO / source).exists(), f"{dockerfile.name} copies missing {source}"


def _user_and_owned(dockerfile: Path) -> tuple[str, set[Path]]:
    """The image's final USER and the folders the Dockerfile makes owned by it."""
    text = dockerfile.read_text().replace("\\\n", " ")
    users = re.findall(r"^USER\s+(\S+)", text, re.MULTILINE)
    user = users[-1] if users else "root"
    owned = {
        Path(folder)
        for owner, folders in re.findall(r"install -d -o (\S+) -g \S+((?:\s+/[^\s&]+)+)", text)
        if owner == user
        for folder in folders.split()
    }
    return user, owned


def _within(path: str, folders: set[Path]) -> bool:
    return any(Path(path) == folder or folder in Path(path).parents for folder in folders)


def test_our_images_run_unprivileged_and_own_what_they_write() -> None:
    from flow.stack.compose import read_env_file, render

    rendered = {
        s.name: s for s in render(DOCKER / "compose.yaml", read_env_file(DOCKER / ".env.example"))
    }
    for name, service in _services().items():
        if "build" not in service:
            continue
        user, owned = _user_and_owned(_dockerfile(service))
        assert user not in {"root", "0"}, f"{name} runs as root"
        assert service.get("user", user) == user, f"{name}: user differs from its image's"
        targets = {Path(str(volume).split(":")[1]) for volume in service.get("volumes", [])}
        # A named volume starts as a copy of the image's folder, owner included.
        for target in targets:
            assert _within(str(target), owned), f"{name}: {target} is not a folder {user} owns"
        env = rendered[name].environment
        for key in ("FLOW_HOME", "SPARK_WORKER_DIR"):
            if key in env:
                assert _within(env[key], owned), f"{name}: {key}={env[key]} is not {user}'s"
        if rendered[name].runs_flow and service["image"].startswith("primus-flow/spark"):
            # Delta tables are written by the driver and the executors: a shared volume.
            assert _within(env["FLOW_LAKE"], targets), f"{name}: FLOW_LAKE is on no volume"
