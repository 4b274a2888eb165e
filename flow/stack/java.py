"""Finding a Java runtime for the JVM parts of the stack (Ivy, the Kafka broker, Spark)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from flow.errors import JavaNotFoundError

__all__ = ["MIN_JAVA", "JavaRuntime", "find_java"]

#: Spark 4 and the Kafka 4 broker both need Java 17.
MIN_JAVA = 17

_INSTALL_HINT = (
    "install a Java 17+ JDK (Debian/Ubuntu: apt-get install openjdk-17-jdk-headless) "
    "or point JAVA_HOME at one"
)


@dataclass(frozen=True)
class JavaRuntime:
    """A ``java`` executable and its major version."""

    executable: Path
    major: int


def _major_version(text: str) -> int | None:
    # `java -version` prints e.g. 'openjdk version "17.0.15" 2025-04-15' or '"1.8.0_392"'.
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not match:
        return None
    first = int(match.group(1))
    return int(match.group(2) or 0) if first == 1 else first


def find_java() -> JavaRuntime:
    """The Java runtime of ``JAVA_HOME``, else the first ``java`` on ``PATH``; 17 or newer."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if not candidate.exists():
            raise JavaNotFoundError(
                f"JAVA_HOME={java_home} has no bin/java; fix JAVA_HOME or unset it"
            )
    else:
        found = shutil.which("java")
        if found is None:
            raise JavaNotFoundError(f"no 'java' on PATH and JAVA_HOME is unset: {_INSTALL_HINT}")
        candidate = Path(found)
    try:
        probe = subprocess.run(
            [str(candidate), "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError as exc:
        raise JavaNotFoundError(f"{candidate} cannot be run ({exc}): {_INSTALL_HINT}") from exc
    major = _major_version(probe.stderr + probe.stdout)
    if major is None:
        raise JavaNotFoundError(f"cannot read the version of {candidate}: {_INSTALL_HINT}")
    if major < MIN_JAVA:
        raise JavaNotFoundError(
            f"{candidate} is Java {major}, older than {MIN_JAVA}: {_INSTALL_HINT}"
        )
    return JavaRuntime(executable=candidate, major=major)
