"""``flow run`` and ``flow submit`` recognise their own options anywhere before APP, before or
after spark-submit's, and leave the application's arguments alone."""

from __future__ import annotations

from typing import Any

import click
import pytest
from click.testing import CliRunner

from flow.cli.jobs import own_options_first, run, submit
from flow.config import StackConfig
from flow.training import parse_args
from flow.workflows.precheck import pipeline_app
from tests.support import REPO, doc_commands, flow_command

PRODUCTION = REPO / "docs" / "production.md"
WORKED = "## Worked example: MinIO (or any S3-compatible server) and a standalone cluster"

APP = "pipelines/ctr_streaming.py"


def _params(command: click.Command, args: list[str]) -> dict[str, Any]:
    return command.make_context(command.name or "run", args).params


@pytest.mark.parametrize(
    "args",
    [
        ["--train", "--channel live", "--master", "spark://h:7077", APP],
        ["--master", "spark://h:7077", "--train", "--channel live", APP],
        ["--master=spark://h:7077", "--train=--channel live", APP],
        ["--verbose", "--train", "--channel live", "--master", "spark://h:7077", APP],
    ],
    ids=["flow first", "spark first", "with =", "after a switch"],
)
def test_train_is_flow_s_wherever_it_stands_before_app(args: list[str]) -> None:
    params = _params(run, args)
    assert params["train_args"] == "--channel live"
    assert [a for a in params["argv"] if a != "--verbose"] in (
        ["--master", "spark://h:7077", APP],
        ["--master=spark://h:7077", APP],
    )


def test_every_flow_option_and_the_app_s_own_arguments() -> None:
    params = _params(
        run,
        [
            "--conf",
            "spark.x=1",
            "--cold",
            "--deploy-mode",
            "client",
            "--train-procs",
            "2",
            "--connectors=kafka",
            APP,
            "--namespace",
            "ctr",
            "--cold",
        ],
    )
    assert params["cold"] is True
    assert params["train_procs"] == 2
    assert params["connectors"] == "kafka"
    # After APP every word is the application's, flow's option names included.
    assert params["argv"] == (
        "--conf", "spark.x=1", "--deploy-mode", "client", APP, "--namespace", "ctr", "--cold"
    )  # fmt: skip


def test_submit_takes_connectors_after_spark_options() -> None:
    params = _params(submit, ["--master", "local[2]", "--connectors", "none", APP])
    assert params["connectors"] == "none"
    assert params["argv"] == ("--master", "local[2]", APP)


def test_reordering_is_a_pure_function_of_the_words() -> None:
    own = {"--train": True, "--cold": False}
    assert own_options_first(["--master", "m", "--cold", "a.py", "--train", "x"], own) == [
        "--cold", "--master", "m", "a.py", "--train", "x"
    ]  # fmt: skip
    assert own_options_first(["--", "--cold"], own) == ["--", "--cold"]


def test_help_shows_app_and_where_the_options_go() -> None:
    shown = CliRunner().invoke(run, ["--master", "spark://h:7077", "--help"]).output
    assert "[SPARK-SUBMIT OPTIONS] APP [APP ARGS]..." in shown
    assert "anywhere before APP" in shown
    assert "ARGV" not in shown


def test_every_command_of_the_production_page_parses_as_printed() -> None:
    """What the page prints is what a user pastes: ``flow run --master ... --train ...`` once
    sent --train to spark-submit ("Unrecognized option"). Every ``flow`` line parses here with
    the real parser, its trainer settings and its pipeline file too, and the exports make a
    stack with the checkpoints where the page says. The lines run, as printed, on a standalone
    cluster and an S3 server in tests/cluster (marked cluster: not in the unit run)."""
    commands = doc_commands(PRODUCTION, WORKED)
    env: dict[str, str] = {}
    flows = []
    for words in commands:
        if words[0] == "export":
            env.update(dict(word.split("=", 1) for word in words[1:]))
        elif words[0] == ".venv/bin/flow":
            flows.append(words[1:])
        else:
            assert words[:2] == ["aws", "--endpoint-url"], words  # the buckets, made by hand
    stack = StackConfig.from_env(env)
    assert stack.checkpoints == "s3://flow/checkpoints"  # "beside the handoff", as it says
    assert len(flows) == 6
    for args in flows:
        command, params = flow_command(args)
        if command in (run, submit):
            argv = list(params["argv"])
            found = pipeline_app(argv)
            assert found is not None, argv
            assert (REPO / found[0]).is_file()
            before_app = argv[: argv.index(str(found[0]))]
            assert before_app == ["--master", "spark://HOST:7077"], argv  # spark-submit's only
        if command is run:
            trainer = parse_args(params["train_args"].split(), prog="flow run --train")
            assert (trainer.namespace, trainer.channels, trainer.max_steps) == (
                "ctr",
                ("live",),
                50,
            )


def test_the_compose_lines_of_the_production_page_parse_as_printed() -> None:
    """The compose section's ``flow`` lines, and those its ``driver`` container runs (its
    entrypoint is ``flow``), parse with the real command line; ``docker compose up`` needs an
    engine, which no test here has (tests/docker checks the file)."""
    parsed = []
    for words in doc_commands(PRODUCTION, "## The compose stack (`docker/compose.yaml`)"):
        if words[0] == ".venv/bin/flow":
            args = words[1:]
        elif words[:2] == ["docker", "compose"] and "run" in words:
            after = words[words.index("run") + 1 :]
            assert after[:2] == ["--rm", "driver"], words
            args = after[2:]
        else:
            continue
        command, params = flow_command(args)
        parsed.append(command.name)
        if command is submit:
            found = pipeline_app(list(params["argv"]))
            assert found is not None
            assert (REPO / found[0]).is_file()
    assert parsed == ["check", "history", "submit"]
