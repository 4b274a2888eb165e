"""Fixtures every test folder shares: an isolated stack of its own, on free ports.

Tests never touch the developer's ``.flow`` stack (which may be running ``make demo``): each
session gets a temporary ``FLOW_HOME`` and free ports. The JVM jar cache is shared with
``make setup`` (``.flow/jars``) so tests do not download 130 MB again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from flow import stack as services
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


@dataclass(frozen=True)
class S3Server:
    """An S3-compatible server (moto's) on 127.0.0.1, with buckets ``handoff``, ``lake`` and
    ``flow``."""

    endpoint: str
    """``http://127.0.0.1:PORT``"""
    port: int

    def env(self) -> dict[str, str]:
        """The S3 settings a stack needs to use it (any key is accepted)."""
        return {
            "FLOW_S3_ENDPOINT": self.endpoint,
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
        }


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One S3-compatible server for the session: pyarrow, pyiceberg, Iceberg's S3FileIO and
    Hadoop's S3A talk to it over HTTP as they would to S3 or MinIO."""
    from flow.stack.local_s3 import local_s3
    from tests.support import free_ports

    (port,) = free_ports(1)
    with local_s3(("handoff", "lake", "flow"), port):
        yield S3Server(f"http://127.0.0.1:{port}", port)


@pytest.fixture(scope="session")
def s3_uri(s3_server: S3Server) -> str:
    """The URI of a folder on the session's S3 server, its options and credentials in it."""
    return (
        f"s3://test:test@handoff/root?endpoint_override=127.0.0.1:{s3_server.port}"
        "&scheme=http&region=us-east-1"
    )
