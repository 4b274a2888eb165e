"""An S3-compatible server (moto's) on 127.0.0.1, for tests and benchmarks of object storage.

Not part of the local stack users run (it keeps objects in memory); the tests' ``s3_server``
fixture and ``flow bench commits --store moto`` start it the same way. moto is a development
dependency (``make setup`` installs it).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from flow.errors import DependencyMissingError

__all__ = ["local_s3"]


@contextmanager
def local_s3(buckets: Sequence[str], port: int | None = None) -> Iterator[int]:
    """A moto S3 server on 127.0.0.1 with ``buckets`` made (any key is accepted); its port."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as e:
        raise DependencyMissingError("moto", "dev", "an S3-compatible test server") from e
    from pyarrow import fs as pafs

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    if port is None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        s3 = pafs.S3FileSystem(
            endpoint_override=f"127.0.0.1:{port}",
            scheme="http",
            access_key="test",
            secret_key="test",
            region="us-east-1",
            allow_bucket_creation=True,
        )
        for bucket in buckets:
            s3.create_dir(bucket)
        yield port
    finally:
        server.stop()
