"""Primus Flow's own JVM code, compiled once into a jar beside the resolved ones.

A few things the stack needs run best as compiled code inside Spark's JVM: the immediate label
strategy's positives (spark_jobs/java/flow/spark/ImmediatePositives.java, a transformWithState
processor, which Spark runs per row; in Python each state access would cross a socket). The
sources ship inside the ``spark_jobs`` package, and the first job that needs them compiles them
with the JDK's ``javac`` against the installed pyspark's jars. The jar's name holds a hash of the
sources, the pyspark jars and the compiler (its path and install time, read without running it:
this runs at every job's start), so an upgrade of any of them builds a new one and a jar is
never stale; on a cluster it travels with ``spark.jars`` like the others.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from flow.errors import JavaNotFoundError
from flow.stack.java import find_java

__all__ = ["FOLDER", "is_project_jar", "javac", "project_jar", "sources"]

FOLDER = "flow-jvm"
"""The jar cache's folder for the project's own jar (beside the resolved profiles')."""

_PREFIX = "primus-flow-"


def is_project_jar(path: Path) -> bool:
    """Whether ``path`` is a jar :func:`project_jar` built."""
    return path.parent.name == FOLDER and path.name.startswith(_PREFIX) and path.suffix == ".jar"


_JDK_HINT = (
    "install a Java 17+ JDK (Debian/Ubuntu: apt-get install openjdk-17-jdk-headless) or point "
    "JAVA_HOME at one: Primus Flow compiles its own Spark operators once, with javac"
)


def sources() -> list[Path]:
    """The Java sources that ship in the ``spark_jobs`` package, in a stable order."""
    spec = importlib.util.find_spec("spark_jobs")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the spark_jobs package is not installed")
    root = Path(next(iter(spec.submodule_search_locations))) / "java"
    found = sorted(root.rglob("*.java"))
    if not found:
        raise FileNotFoundError(f"no Java sources under {root}: the installation is incomplete")
    return found


def javac() -> Path:
    """The ``javac`` beside the Java runtime the stack runs (JAVA_HOME's, else PATH's), else
    PATH's. Found without starting a process: every Spark job's start asks for it."""
    java_home = os.environ.get("JAVA_HOME")
    runtime = Path(java_home) / "bin" / "java" if java_home else shutil.which("java")
    if runtime is not None and (beside := Path(runtime).resolve().parent / "javac").exists():
        return beside
    found = shutil.which("javac")
    if found is None:
        # Whatever is wrong with the runtime is said first (find_java), then that it has no javac.
        raise JavaNotFoundError(
            f"{find_java().executable} is a Java runtime without javac: {_JDK_HINT}"
        )
    return Path(found)


def _identity(compiler: Path) -> str:
    """Which compiler this is, for the jar's name, without running it (a JVM start, ~0.1 s):
    its real path and when it was installed."""
    real = compiler.resolve()
    stat = real.stat()
    return f"{real}:{stat.st_size}:{stat.st_mtime_ns}"


def project_jar(jar_cache: Path, spark_jars: Path) -> Path:
    """The project's jar, compiled against the jars in ``spark_jars`` (pyspark's) unless the
    cache has it already. Safe to call from processes side by side: each builds into a folder
    of its own and moves the finished jar into place in one step."""
    compiler = javac()
    files = sources()
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    digest.update(_identity(compiler).encode())
    for jar in sorted([*spark_jars.glob("spark-*.jar"), *spark_jars.glob("hadoop-*.jar")]):
        digest.update(jar.name.encode())
    folder = jar_cache / FOLDER
    target = folder / f"{_PREFIX}{digest.hexdigest()[:16]}.jar"
    if target.is_file():
        return target
    find_java()  # (a runtime older than Spark's is named before javac fails on it)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".build-") as build:
        classes = Path(build) / "classes"
        done = subprocess.run(
            [
                str(compiler),
                "--release",
                "17",
                "-nowarn",
                "-encoding",
                "UTF-8",
                "-cp",
                str(spark_jars / "*"),
                "-d",
                str(classes),
                *map(str, files),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0:
            raise JavaNotFoundError(
                f"{compiler} could not compile Primus Flow's Spark operators against "
                f"{spark_jars} (is pyspark the version the project pins?):\n"
                f"{(done.stderr or done.stdout).strip()[-2000:]}"
            )
        staged = Path(build) / target.name
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(classes.rglob("*")):
                if path.is_file():
                    archive.write(path, path.relative_to(classes).as_posix())
        os.replace(staged, target)
    return target
