"""The terminal output of commands and jobs (rich), shared so it looks the same everywhere."""

from __future__ import annotations

import sys

from rich.console import Console

__all__ = ["console"]


def console() -> Console:
    """A stderr console; 120 columns when stderr is not a terminal (logs, CI), not rich's 80."""
    return Console(stderr=True, width=None if sys.stderr.isatty() else 120)
