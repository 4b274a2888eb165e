"""Fixtures every test folder shares: an isolated stack of its own, on free ports.

Tests never touch the developer's ``.flow`` stack (which may be running ``make demo``): each
session gets a temporary ``FLOW_HOME`` and free ports. The JVM jar cache is shared with
``make setup`` (``.flow/jars``) so tests do not download 130 MB again.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flow import services
from flow.config import StackConfig
from tests.support import stack_env_for


@pytest.fixture(scope="session")
def stack_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Settings of this test session's stack."""
    return stack_env_for(tmp_path_factory.mktemp("flow-home"))


@pytest.fixture(scope="session")
def stack(stack_env: dict[str, str]) -> StackConfig:
    return StackConfig.from_env(stack_env)


@pytest.fixture(scope="session")
def running_stack(stack: StackConfig) -> Iterator[StackConfig]:
    """The session's services, up for the whole session and down at its end."""
    try:
        rows = services.up(stack)
        unhealthy = [r for r in rows if not r.healthy]
        if unhealthy:
            pytest.fail(f"the test stack did not come up: {unhealthy}")
        yield stack
    finally:
        services.down(stack)
