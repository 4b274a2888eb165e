"""``flow compose check``: what each service of a compose file gets, checked before ``up``."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from flow.cli.common import console, friendly
from flow.errors import ConfigError

__all__ = ["compose"]


@click.group()
def compose() -> None:
    """Compose files of the production-shaped stack (docker/compose.yaml)."""


@compose.command()
@click.argument(
    "file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=Path("docker/compose.yaml"),
)
@click.option(
    "--env-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="compose's variables (default: the .env beside FILE, if any); the shell's win",
)
@click.option("--quiet", "-q", is_flag=True, help="only the problems")
@friendly
def check(file: Path, env_file: Path | None, quiet: bool) -> None:
    """Print the environment each Primus Flow service of FILE gets, secrets hidden, and check
    it: accepted settings, every location in the file's S3 store with one S3 configuration,
    buckets created, hosts that are services. Exit 1 on a problem. No Docker engine needed."""
    from flow.stack.compose import check as check_services
    from flow.stack.compose import compose_variables, render

    services = render(file, compose_variables(file, env_file))
    if not quiet:
        for service in services:
            if not service.runs_flow:
                continue
            command = " ".join(service.command) or "(the image's)"
            console.print(f"[bold]{service.name}[/]  {escape(command)}", highlight=False)
            for key, value in service.shown().items():
                console.print(f"  {key}={escape(value)}", highlight=False, soft_wrap=True)
    problems = check_services(services)
    if problems:
        lines = "\n".join(f"  - {problem}" for problem in problems)
        raise ConfigError(f"{file}: {len(problems)} problem(s):\n{lines}")
    names = ", ".join(s.name for s in services if s.runs_flow)
    console.print(f"[green]ok[/]: {escape(names)} share one storage configuration", highlight=False)
