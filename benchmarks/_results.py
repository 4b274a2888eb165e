"""Where a benchmark's result goes: ``$FLOW_HOME/bench/NAME-TIME.json``, written the same way
by every benchmark (``save``), which returns the path (a plot goes beside it with ``.png``).

Under ``flow bench --json NAME`` the result is also written to the file FLOW_BENCH_RESULT names,
which the command then prints on stdout: a benchmark that saves through here is scriptable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flow.config import BENCH_RESULT_ENV, StackConfig

__all__ = ["save", "stamp"]


def stamp() -> str:
    """The time in a result's name, for a benchmark that names other files by it first."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S}"


def save(
    name: str,
    results: Any,
    *,
    folder: Path | None = None,
    at: str | None = None,
    also: Path | None = None,
    indent: int = 2,
    default: Callable[[Any], Any] = str,
) -> Path:
    """Write ``results`` as JSON to ``folder/NAME-TIME.json`` (default folder
    ``$FLOW_HOME/bench``, time ``at`` or now) and return that path; also to ``also`` (a
    benchmark's ``--result-file``) and to FLOW_BENCH_RESULT's file when set."""
    folder = folder or StackConfig.from_env().home / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{at or stamp()}.json"
    text = json.dumps(results, indent=indent, default=default)
    path.write_text(text)
    wanted = os.environ.get(BENCH_RESULT_ENV)
    for extra in (also, Path(wanted) if wanted else None):
        if extra is not None:
            extra.write_text(text)
    return path
