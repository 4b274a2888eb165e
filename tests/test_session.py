"""The test session's own settings, which a tidy-up of tests/support.py could silently drop."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from flow.stack.java import find_java
from tests.support import SHORT_JOB_JVM, clean_environ, stack_env_for


def _tier(env: dict[str, str]) -> str:
    """The highest JIT tier a JVM started with ``env`` compiles to."""
    flags = subprocess.run(
        [str(find_java().executable), "-XX:+PrintFlagsFinal", "-version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    ).stdout
    (line,) = [line.split() for line in flags.splitlines() if " TieredStopAtLevel " in line]
    return line[3]


@pytest.mark.skipif("JAVA_TOOL_OPTIONS" in os.environ, reason="JAVA_TOOL_OPTIONS exported: yours")
def test_the_commands_jvms_compile_with_c1_only_and_the_tests_own_with_the_full_jit(
    tmp_path: Path,
) -> None:
    """C1 for the short jobs the tests start (without it the integration suite spends a third
    more CPU in them); the full JIT for the pytest process's Spark session, which C1 slowed."""
    env = stack_env_for(tmp_path)
    assert env["JAVA_TOOL_OPTIONS"] == SHORT_JOB_JVM["JAVA_TOOL_OPTIONS"]
    assert _tier({**clean_environ(), **env}) == "1"  # as run_flow starts a command
    assert _tier(dict(os.environ)) == "4"  # as pyspark starts the session's own JVM
