"""A pipeline file checked before anything starts: ``flow run`` builds its pipeline first.

A pipeline is validated as it is built, in Python (sources' columns, features, derived
expressions that can be checked without Spark): ``python pipeline.py`` shows a mistake at once.
Under ``flow run`` the same mistake used to wait for the services, the warm driver or
spark-submit to start: 16 s on a quiet machine, up to 106 s on a loaded one (issue 48). So
``flow run`` runs the file itself first, in its own process's interpreter, with
``run_main`` switched to checking (``checking_only``): the pipeline is built, its run
arguments parsed and every location the run writes probed (a streaming checkpoint Spark cannot
use was refused 72 s in, after the executors started), then nothing runs. Only files that call
``run_main`` are checked this way; anything else is left to spark-submit, since its
module-level code might start Spark.
"""

from __future__ import annotations

import ast
import runpy
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from flow.pipeline.run import checking_only

__all__ = ["check_pipeline_file", "pipeline_app"]


def pipeline_app(argv: Sequence[str]) -> tuple[Path, list[str]] | None:
    """The pipeline file among spark-submit's ``argv`` and its arguments, when it is a Python
    file that exists and calls ``run_main``; else None."""
    index = next((i for i, a in enumerate(argv) if a.endswith(".py")), None)
    if index is None:
        return None
    app = Path(argv[index])
    if not app.is_file():
        return None  # spark-submit says so, as before
    try:
        tree = ast.parse(app.read_text(), str(app))
    except (SyntaxError, UnicodeDecodeError, OSError):
        return None  # Python's own error, from spark-submit's run of it
    calls = (
        n.func
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute))
    )
    if not any((f.id if isinstance(f, ast.Name) else f.attr) == "run_main" for f in calls):
        return None
    return app, list(argv[index + 1 :])


@contextmanager
def _as_script(app: Path, args: list[str]) -> Iterator[None]:
    """``sys.argv`` and ``sys.path[0]`` as ``python APP ARGS`` would have them."""
    argv, path = sys.argv[:], sys.path[:]
    sys.argv = [str(app), *args]
    sys.path.insert(0, str(app.resolve().parent))
    try:
        yield
    finally:
        sys.argv, sys.path[:] = argv, path


def check_pipeline_file(argv: Sequence[str]) -> None:
    """Build the pipeline of ``argv``'s file and parse its arguments, running nothing. A
    mistake exits as ``python APP`` would (its one line, exit 1) before anything starts."""
    found = pipeline_app(argv)
    if found is None:
        return
    app, args = found
    with _as_script(app, args), checking_only():
        try:
            runpy.run_path(str(app), run_name="__main__")
        except SystemExit as done:
            if done.code not in (0, None):
                raise
