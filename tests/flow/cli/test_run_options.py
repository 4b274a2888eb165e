"""``flow run`` and ``flow submit`` recognise their own options anywhere before APP, before or
after spark-submit's, and leave the application's arguments alone."""

from __future__ import annotations

from typing import Any

import click
import pytest
from click.testing import CliRunner

from flow.cli.jobs import own_options_first, run, submit

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
