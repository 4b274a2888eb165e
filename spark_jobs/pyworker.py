"""PySpark's worker daemon, without Spark's zips and jars costing every Python task.

Spark starts Python workers with three archives first on ``PYTHONPATH``: ``pyspark.zip``,
py4j's zip and the ``spark-core`` jar (5,000+ entries). With them come three costs, found with
py-spy across the worker processes:

- Before each task a worker calls ``importlib.invalidate_caches()``. On Python 3.10 and 3.11
  every ``zipimporter`` then reads its archive's whole directory again (CPython gh-103200,
  made lazy in 3.12): ~0.2 s of CPU per task, about what writing a task's 250k rows costs.
- ``pyspark.zip`` holds no bytecode, so each new daemon compiles pyspark's modules from source
  (seconds of CPU per session).
- After each task a reused worker runs ``gc.collect()`` over everything pyspark, pyarrow and
  pandas made at import (~40 ms).

Started as ``spark.python.daemon.module`` (the stack sets it for local masters), this module
drops those archives from ``sys.path`` when they lie inside a pip-installed pyspark that can
be imported without them (the same files, with their bytecode), makes a remaining archive's
invalidation re-read it only if the file changed, imports and freezes the Arrow worker's modules
(:func:`freeze_imports`), then runs PySpark's own daemon.
"""

from __future__ import annotations

import gc
import os
import sys
import zipimport
from importlib.machinery import PathFinder
from typing import Any

__all__ = ["freeze_imports", "install", "prefer_installed_pyspark"]

_STAMP = "_flow_stamp"


def _stamp(archive: str) -> tuple[int, int] | None:
    try:
        st = os.stat(archive)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def prefer_installed_pyspark() -> list[str]:
    """Drop the archives inside an installed pyspark from ``sys.path``; those dropped."""
    folders = [p for p in sys.path if not p.endswith((".zip", ".jar"))]
    pyspark = PathFinder.find_spec("pyspark", folders)
    if pyspark is None or pyspark.origin is None or PathFinder.find_spec("py4j", folders) is None:
        return []  # a Spark distribution's own Python: the archives are the only copy
    home = os.path.dirname(os.path.realpath(pyspark.origin)) + os.sep
    dropped = [
        p for p in sys.path if p.endswith((".zip", ".jar")) and os.path.realpath(p).startswith(home)
    ]
    sys.path[:] = [p for p in sys.path if p not in dropped]
    return dropped


def install() -> None:
    """Make ``zipimporter.invalidate_caches`` skip archives unchanged since their last read."""
    if sys.version_info >= (3, 12):
        return  # invalidation is lazy there already
    original = zipimport.zipimporter.invalidate_caches
    if getattr(original, "_flow_lazy", False):
        return

    def invalidate_caches(self: Any) -> None:
        stamp = _stamp(self.archive)
        if stamp is not None and getattr(self, _STAMP, None) == stamp:
            return
        original(self)
        setattr(self, _STAMP, stamp)

    invalidate_caches._flow_lazy = True  # type: ignore[attr-defined]
    zipimport.zipimporter.invalidate_caches = invalidate_caches  # type: ignore[method-assign]
    # Importers already made (pyspark.zip's, py4j's) read their directory moments ago.
    for finder in list(sys.path_importer_cache.values()):
        if isinstance(finder, zipimport.zipimporter):
            setattr(finder, _STAMP, _stamp(finder.archive))


def freeze_imports() -> None:
    """Import what Arrow tasks use, then exempt it all from the garbage collector.

    A reused worker runs ``gc.collect()`` after every task. With pyspark, pyarrow and pandas
    imported that scanned ~75k objects, ~40 ms a task here. Imported once in the daemon and
    frozen before it forks workers, they are shared, and a worker's collection scans only what
    it made since (the recipe of ``gc.freeze``'s documentation for pre-fork servers).
    """
    import pyspark.sql.pandas.serializers  # noqa: F401  (imports pyarrow and pandas)

    gc.collect()
    gc.freeze()


if __name__ == "__main__":
    prefer_installed_pyspark()
    install()
    # Importing it picks the worker module from sys.argv, as `python -m pyspark.daemon` does.
    from pyspark import daemon

    freeze_imports()
    daemon.manager()  # type: ignore[no-untyped-call]
