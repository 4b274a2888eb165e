"""What every ``flow`` command shares: the console, friendly errors, the stack, progress lines."""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from rich.console import Console
from rich.markup import escape

from flow.config import StackConfig
from flow.console import console as make_console
from flow.console import debug_requested
from flow.errors import FlowError

__all__ = ["console", "emit_json", "friendly", "out", "progress", "stack_config"]

console = make_console()
"""Progress, warnings and errors: stderr."""
out = Console(width=None if sys.stdout.isatty() else 120)
"""A command's result (its tables, its summary): stdout, so that `| grep` and scripts see it."""


def emit_json(data: object) -> None:
    """A command's result as JSON on stdout (``--json``): one document, nothing else there."""
    print(json.dumps(data, indent=2, default=str), flush=True)


F = TypeVar("F", bound=Callable[..., Any])


def friendly(fn: F) -> F:
    """Print a FlowError as a one-paragraph message (no traceback) and exit 1; with ``flow
    --debug`` (FLOW_DEBUG=1) its traceback first. Other exceptions are bugs: they propagate."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FlowError as exc:
            if debug_requested(()):
                traceback.print_exception(exc)
            console.print(
                f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True
            )
            raise SystemExit(1) from None

    return wrapper  # type: ignore[return-value]


def stack_config() -> StackConfig:
    return StackConfig.from_env()


def progress(message: str) -> None:
    console.print(f"  [dim]{time.strftime('%H:%M:%S')}[/] {escape(message)}", highlight=False)
