"""The environment each service of docker/compose.yaml gets, against the stack's settings.

Rendered as ``docker compose`` would (anchors, ``${VAR:?...}`` from docker/.env.example, the
images' ``ENV``) by :mod:`flow.stack.compose`; what a service runs is parsed by the real
command lines (flow's click commands, the trainer's TrainConfig, the pipeline's own flags).
"""

from __future__ import annotations

import re
import runpy
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from flow.cli import main as flow_main
from flow.config import AWS_VARS, ENV_VARS, StackConfig
from flow.errors import ConfigError
from flow.stack.compose import Service, check, interpolate, read_env_file, render
from flow.training import parse_args
from spark_jobs.submit import split_submit_argv
from tests.support import REPO
from trainers.__main__ import COMMANDS as TRAINER_COMMANDS

COMPOSE = REPO / "docker" / "compose.yaml"
EXAMPLE = read_env_file(REPO / "docker" / ".env.example")


def _services() -> dict[str, Service]:
    return {service.name: service for service in render(COMPOSE, EXAMPLE)}


def _flow_services() -> dict[str, Service]:
    return {name: s for name, s in _services().items() if s.runs_flow}


def test_every_flow_service_keeps_its_storage_in_the_compose_store() -> None:
    services = _flow_services()
    assert {"driver", "spark-worker", "live", "trainer"} <= set(services)
    assert check(list(_services().values())) == []
    for name, service in services.items():
        stack = StackConfig.from_env(service.environment)
        roots = (stack.catalog.warehouse, stack.handoff, stack.feature_state, stack.checkpoints)
        assert all(root.startswith("s3://") for root in roots), name
        assert stack.s3.endpoint == "http://minio:9000"
        assert stack.s3.access_key == EXAMPLE["MINIO_ROOT_USER"]
        assert stack.s3.secret_key == EXAMPLE["MINIO_ROOT_PASSWORD"]
        # The image's settings come through: jars resolved at build time, never fetched.
        if service.image.startswith("primus-flow/spark"):
            assert stack.offline
            assert str(stack.jar_cache) == "/opt/primus-flow/jars"


def test_every_setting_a_service_gives_is_documented() -> None:
    table = (REPO / "docs" / "local-stack.md").read_text()
    documented = set(re.findall(r"^\| `([A-Z0-9_]+)` \|", table, re.MULTILINE))
    for name, service in _flow_services().items():
        for key in service.own:
            if key.startswith(("FLOW_", "MLFLOW_TRACKING_URI")):
                assert key in documented, f"{name}: {key} is not in the settings table"
                assert key in ENV_VARS, f"{name}: {key} is not a setting"
            elif key.startswith("AWS_"):
                assert key in AWS_VARS, f"{name}: {key}"


def _with(service: Service, **changes: str) -> Service:
    return replace(service, environment={**service.environment, **changes})


def _problems_with(name: str, **changes: str) -> list[str]:
    services = _services()
    services[name] = _with(services[name], **changes)
    return check(list(services.values()))


def test_a_local_location_in_one_service_is_named() -> None:
    problems = _problems_with("trainer", FLOW_CHECKPOINTS="/var/lib/flow/checkpoints")
    assert any(p.startswith("trainer: FLOW_CHECKPOINTS is /var/lib/flow") for p in problems)


def test_other_keys_than_the_stores_are_refused() -> None:
    problems = _problems_with("live", AWS_SECRET_ACCESS_KEY="not-the-password")
    assert any(
        "live: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY are not minio's" in p for p in problems
    )
    # and the services no longer share one configuration
    assert any("do not share one S3 configuration" in p for p in problems)


def test_a_bucket_nobody_creates_and_a_host_that_is_no_service_are_named() -> None:
    problems = _problems_with(
        "driver", FLOW_HANDOFF="s3://handoff-bucket/x", FLOW_KAFKA_BOOTSTRAP="kafak:19092"
    )
    assert any("bucket 'handoff-bucket' (FLOW_HANDOFF)" in p for p in problems)
    assert any("driver: FLOW_KAFKA_BOOTSTRAP names host 'kafak'" in p for p in problems)


def test_a_container_that_would_start_its_own_services_is_named() -> None:
    services = _services()
    trainer = services["trainer"]
    env = {k: v for k, v in trainer.environment.items() if k != "MLFLOW_TRACKING_URI"}
    services["trainer"] = replace(trainer, environment=env)
    assert any("MLFLOW_TRACKING_URI is unset" in p for p in check(list(services.values())))


def test_an_unknown_setting_is_named() -> None:
    problems = _problems_with("spark-worker", FLOW_HANDOF="s3://flow/handoff")
    assert any(p.startswith("spark-worker: unknown setting(s) FLOW_HANDOF") for p in problems)


def test_interpolation_follows_compose() -> None:
    given = {"SET": "v", "EMPTY": ""}
    assert interpolate("$${SET} ${SET} $SET ${NONE:-d} ${EMPTY:-d} ${EMPTY-d}", given) == (
        "${SET} v v d d "
    )
    assert interpolate("${SET:+alt}${NONE:+alt}", given) == "alt"
    with pytest.raises(ConfigError, match=r"MINIO_ROOT_PASSWORD: set it in docker/\.env"):
        interpolate("${MINIO_ROOT_PASSWORD:?set it in docker/.env}", {})


def test_without_the_passwords_render_says_which_to_set() -> None:
    with pytest.raises(ConfigError, match="MINIO_ROOT_PASSWORD"):
        render(COMPOSE, {})


def test_render_reads_list_environments_env_files_and_the_images_env(tmp_path: Path) -> None:
    (tmp_path / "app.Dockerfile").write_text(
        "FROM python:3.11.12-slim\nENV FLOW_HOME=/home \\\n    FLOW_OFFLINE=1\nENV OLD value here\n"
    )
    (tmp_path / "extra.env").write_text("# a comment\nFLOW_SPARK_CDS='0'\n")
    (tmp_path / "compose.yaml").write_text(
        yaml.safe_dump(
            {
                "services": {
                    "app": {
                        "image": "app:1.0",
                        "build": {"context": ".", "dockerfile": "app.Dockerfile"},
                        "env_file": ["extra.env"],
                        "environment": ["FLOW_HOME=/elsewhere", "FROM_SHELL"],
                    }
                }
            }
        )
    )
    [app] = render(tmp_path / "compose.yaml", {"FROM_SHELL": "yes"})
    assert app.environment == {
        "FLOW_HOME": "/elsewhere",
        "FLOW_OFFLINE": "1",
        "OLD": "value here",
        "FLOW_SPARK_CDS": "0",
        "FROM_SHELL": "yes",
    }
    assert app.own == {"FLOW_HOME", "FLOW_SPARK_CDS", "FROM_SHELL"}


def _flow_command(argv: list[str]) -> click.Context:
    """``flow ARGV`` parsed by the real commands, without running them."""
    command: click.Command = flow_main
    rest = list(argv)
    while isinstance(command, click.Group):
        name, *rest = rest
        found = command.get_command(click.Context(command), name)
        assert found is not None, f"flow has no command {name!r}"
        command = found
    return command.make_context(command.name or "", rest)


def test_the_trainer_follows_the_live_channel_and_registers_its_model() -> None:
    trainer = _services()["trainer"]
    subcommand, *argv = trainer.command
    assert subcommand in TRAINER_COMMANDS
    config = parse_args(argv)
    assert "live" in config.channels
    assert config.follow
    assert config.register_as
    assert config.export_every
    assert config.device == "cuda"
    # Its checkpoints resolve into the shared store, so a restarted container resumes.
    resolved = config.resolved(StackConfig.from_env(trainer.environment))
    assert resolved.checkpoint_dir is not None
    assert resolved.checkpoint_dir.startswith("s3://flow/checkpoints/ctr/trainer/")


class _RecordedError(Exception):
    """Raised by the stand-in engine: the pipeline built and its flags parsed."""


def test_the_flow_services_commands_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[Any] = []

    class Engine:
        def run(self, spec: Any, stack: StackConfig, options: Any) -> int:
            ran.append((spec, options))
            raise _RecordedError

    for name, service in _flow_services().items():
        if not service.image.startswith("primus-flow/spark") or service.entrypoint is not None:
            continue  # the image's entry point is `flow`
        if not service.command:
            continue  # `docker compose run --rm driver ...` gives one
        _flow_command(service.command)
        if service.command[0] != "submit":
            continue
        submitted = split_submit_argv(service.command[1:])
        assert (REPO / submitted.app).is_file(), f"{name}: no {submitted.app}"
        # The pipeline file as spark-submit would run it, with the container's settings; the
        # engine is replaced, so nothing starts: what is checked is that its flags parse.
        with monkeypatch.context() as patch:
            for key, value in service.environment.items():
                patch.setenv(key, value)
            patch.setattr("flow.pipeline.run.load_engine", lambda _name: Engine())
            patch.setattr(sys, "argv", [submitted.app, *submitted.app_args])
            with pytest.raises(_RecordedError):
                runpy.run_path(str(REPO / submitted.app), run_name="__main__")
        spec, options = ran[-1]
        assert options.mode == "continuous", name
        assert any(stage.channel == "live" for stage in spec.stages)


def test_flow_compose_check_prints_each_service_with_its_secrets_hidden(tmp_path: Path) -> None:
    from click.testing import CliRunner

    env_file = REPO / "docker" / ".env.example"
    runner = CliRunner()
    shown = runner.invoke(
        flow_main, ["compose", "check", str(COMPOSE), "--env-file", str(env_file)]
    )
    assert shown.exit_code == 0, shown.output
    assert "trainer  train --namespace=ctr" in shown.output
    assert "FLOW_HANDOFF=s3://flow/handoff" in shown.output
    assert EXAMPLE["MINIO_ROOT_PASSWORD"] not in shown.output
    assert "AWS_SECRET_ACCESS_KEY=***" in shown.output

    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE.read_text().replace("s3://flow/handoff", "/var/lib/flow/handoff"))
    failed = runner.invoke(
        flow_main, ["compose", "check", str(broken), "--env-file", str(env_file)]
    )
    assert failed.exit_code == 1
    assert "FLOW_HANDOFF is /var/lib/flow/handoff" in failed.output
