"""docs/own-data.md stays true: every ``flow`` command in it parses with the real CLI (options
that exist, values they take), and its pipeline excerpts are what the pipeline files hold."""

from __future__ import annotations

import re
import shlex

import click
import pytest

from flow.cli import main
from tests.support import REPO

GUIDE = REPO / "docs" / "own-data.md"


def blocks(kind: str) -> list[str]:
    return re.findall(rf"^```{kind}\n(.*?)^```", GUIDE.read_text(), re.MULTILINE | re.DOTALL)


def flow_commands() -> list[list[str]]:
    commands = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == [".venv/bin/flow"]:
                commands.append(words[1:])
    return commands


def parse(args: list[str]) -> click.Command:
    """The command ``args`` reach, parsed as click would before running it (no callback runs)."""
    command: click.Command = main
    ctx = main.make_context("flow", list(args))
    while isinstance(command, click.Group):
        rest = [*ctx._protected_args, *ctx.args]
        name, sub, rest = command.resolve_command(ctx, rest)
        assert sub is not None, f"no command {name!r}"
        ctx = sub.make_context(name, rest, parent=ctx)
        command = sub
    return command


def test_the_guide_has_the_commands_it_teaches() -> None:
    names = {" ".join(c[:2]) for c in flow_commands()}
    assert {
        "load ratings.csv",
        "import criteo",
        "generate criteo",
        "run pipelines/ratings.py",
    } <= names


@pytest.mark.parametrize("args", flow_commands(), ids=" ".join)
def test_every_flow_command_in_the_guide_parses(args: list[str]) -> None:
    parse(args)


def test_a_wrong_flag_would_be_caught() -> None:
    with pytest.raises(click.UsageError, match="--epoch"):
        parse(["load", "ratings.csv", "--table", "a.b", "--epoch", "s"])


def test_the_guide_s_pipeline_excerpts_are_in_the_pipeline_files() -> None:
    excerpts = [b for b in blocks("python") if b.startswith("# pipelines/")]
    assert len(excerpts) == 2
    for excerpt in excerpts:
        first, _, body = excerpt.partition("\n")
        assert body in (REPO / first.removeprefix("# ")).read_text(), first
