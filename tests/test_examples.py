"""The scheduler examples run the same command, one run at a time; the Kubernetes example is
complete: every object it names is defined by its files, its settings are flow's, its image is
pinned and keeps its entrypoint."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml

from flow.config import AWS_VARS, ENV_VARS, StackConfig
from tests.support import REPO

EXAMPLES = REPO / "examples" / "schedulers"
KUBERNETES = ("retrain-config.yaml", "retrain-cronjob.yaml")


def test_every_scheduler_example_calls_flow_retrain() -> None:
    for name in ("crontab", "retrain-cronjob.yaml", "airflow_retrain_dag.py"):
        assert "flow" in (EXAMPLES / name).read_text(), name
        assert "retrain pipelines/ctr_backfill.py" in " ".join(
            (EXAMPLES / name).read_text().replace('", "', " ").split()
        ), name


def _objects() -> list[dict[str, Any]]:
    found = []
    for name in KUBERNETES:
        for document in yaml.safe_load_all((EXAMPLES / name).read_text()):
            assert isinstance(document, dict), f"{name}: a document that is not an object"
            assert {"apiVersion", "kind", "metadata"} <= document.keys(), name
            found.append(document)
    return found


def _defined(kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in _objects() if o["kind"] == kind}


def _pod(job: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return pod


def _references(pod: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(kind, name) of every ConfigMap, Secret and ServiceAccount the pod refers to."""
    if "serviceAccountName" in pod:
        yield "ServiceAccount", pod["serviceAccountName"]
    for volume in pod.get("volumes", []):
        if "configMap" in volume:
            yield "ConfigMap", volume["configMap"]["name"]
        if "secret" in volume:
            yield "Secret", volume["secret"]["secretName"]
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                yield "ConfigMap", source["configMapRef"]["name"]
            if "secretRef" in source:
                yield "Secret", source["secretRef"]["name"]
        for variable in container.get("env", []):
            reference = variable.get("valueFrom", {})
            if "configMapKeyRef" in reference:
                yield "ConfigMap", reference["configMapKeyRef"]["name"]
            if "secretKeyRef" in reference:
                yield "Secret", reference["secretKeyRef"]["name"]
    for mount in (m for c in pod["containers"] for m in c.get("volumeMounts", [])):
        yield "volume", mount["name"]


def test_the_cronjob_refers_only_to_objects_the_files_define() -> None:
    (job,) = _defined("CronJob").values()
    pod = _pod(job)
    volumes = {v["name"] for v in pod.get("volumes", [])}
    references = list(_references(pod))
    assert ("ConfigMap", "flow-stack") in references
    assert any(kind == "Secret" for kind, _ in references)
    for kind, name in references:
        known = volumes if kind == "volume" else _defined(kind)
        assert name in known, f"the CronJob names {kind} {name!r}, which no file defines"


def test_the_cronjob_forbids_concurrent_runs_and_keeps_the_image_s_entrypoint() -> None:
    (job,) = _defined("CronJob").values()
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    (container,) = _pod(job)["containers"]
    assert "command" not in container  # the image's ENTRYPOINT (tini -- flow) stays
    assert container["args"][:2] == ["retrain", "pipelines/ctr_backfill.py"]
    image = container["image"]
    assert "@sha256:" in image or (":" in image and not image.endswith(":latest")), image
    dockerfile = (REPO / "docker" / "spark.Dockerfile").read_text()
    assert 'ENTRYPOINT ["tini", "--", "flow"]' in dockerfile
    assert "--build-arg EXTRAS=spark,train,prod" in (EXAMPLES / "retrain-cronjob.yaml").read_text()
    rules = job["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"]
    assert rules[0]["onExitCodes"]["values"] == [3, 4, 5]  # outcomes, not errors to retry


def test_the_config_holds_flow_s_settings_and_the_secret_the_credentials() -> None:
    (config,) = _defined("ConfigMap").values()
    (secret,) = _defined("Secret").values()
    settings = {k: str(v) for k, v in config["data"].items()}
    credentials = {k: str(v) for k, v in secret["stringData"].items()}
    assert set(settings) <= set(ENV_VARS), set(settings) - set(ENV_VARS)
    assert set(credentials) <= set(AWS_VARS), set(credentials) - set(AWS_VARS)
    assert not set(settings) & set(AWS_VARS)  # credentials only in the Secret
    stack = StackConfig.from_env({**settings, **credentials, "FLOW_HOME": "/var/lib/flow"})
    # Pointed at external services: flow retrain starts none of its own there.
    assert not stack.mlflow.managed
    assert stack.catalog.type == "rest"
