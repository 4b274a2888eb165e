"""Class-data sharing for the Spark driver: a job's JVM maps the classes an earlier job loaded.

A Spark driver spends seconds of every short job loading and verifying the same classes (Spark,
Iceberg, Delta, Kafka: some 20,000). A dynamic class-data-sharing archive (JDK 13+) holds them
ready to map: the first job started by ``flow submit``/``flow run`` writes it when its JVM exits
(``-XX:ArchiveClassesAtExit``), every later job with the same jars and Java maps it
(``-XX:SharedArchiveFile``). Measured on 2 cores: a driver's start to its first Iceberg read
went from 24.1 s to 16.4 s (docs/experiments/2026-11-23-startup.md).

The archive is named by what it depends on (the Java runtime, pyspark's version, the job's
jars), made under a temporary name and moved into place when its job ends, so two first jobs at
once never map a half-written file. A JVM that cannot map an archive (another Java after all)
runs without one, silently (``-Xshare:auto``, the default); ``FLOW_SPARK_CDS=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pyspark

__all__ = ["MAKING_ARCHIVE", "archive_options"]

MAKING_ARCHIVE = (
    "the first job with these jars: its driver also writes a class archive as it ends (about "
    "30 s, once), which makes later jobs start faster (FLOW_SPARK_CDS=0: never)"
)

_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
"""Without it the JVM warns of every class it cannot archive when it exits (hundreds)."""


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java") or "java"
    return os.path.realpath(found)


def archive_options(home: Path, jars: Sequence[str]) -> tuple[str, Callable[[int], None] | None]:
    """JVM options for a driver with ``jars``, and (when this launch makes the archive) what to
    call with its exit code when it ends: the archive moved into place."""
    key = hashlib.sha256("|".join([_java(), pyspark.__version__, *jars]).encode()).hexdigest()[:16]
    folder = home / "jvm"
    final = folder / f"spark-driver-{key}.jsa"
    if final.exists():
        return f"-XX:SharedArchiveFile={final} {_QUIET}", None
    folder.mkdir(parents=True, exist_ok=True)
    made = folder / f".spark-driver-{key}.{uuid.uuid4().hex[:8]}.jsa"

    def keep(_code: int) -> None:
        # A job that failed still loaded its classes: its archive is as good.
        if made.exists() and made.stat().st_size > 0:
            os.replace(made, final)
        else:
            made.unlink(missing_ok=True)

    return f"-XX:ArchiveClassesAtExit={made} {_QUIET}", keep
