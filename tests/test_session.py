"""The test session's own settings, which a tidy-up of conftest.py could silently drop."""

from __future__ import annotations

import os
import subprocess

import pytest

from flow.stack.java import find_java
from tests.conftest import TEST_JVM_OPTIONS, USERS_JVM_OPTIONS


@pytest.mark.skipif(USERS_JVM_OPTIONS is not None, reason="JAVA_TOOL_OPTIONS exported: yours")
def test_every_jvm_the_tests_start_compiles_with_c1_only() -> None:
    """Without it the integration suite spends a third more CPU (and CI ~35 minutes' budget)."""
    assert os.environ["JAVA_TOOL_OPTIONS"] == TEST_JVM_OPTIONS
    java = find_java().executable
    flags = subprocess.run(
        [str(java), "-XX:+PrintFlagsFinal", "-version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    (level,) = [line.split() for line in flags.splitlines() if " TieredStopAtLevel " in line]
    assert level[3] == "1", level  # the JVM picked it up from the environment
