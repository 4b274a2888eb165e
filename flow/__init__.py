"""Primus Flow's engine-neutral core.

The stack's settings (:class:`StackConfig`), the local services, JVM artifacts, tracking, the
engine plugin registry and the CLI. This package imports neither pyspark nor torch at module
level; the Spark side lives in ``spark_jobs`` and the PyTorch side in ``trainers``, and the two
meet only at the handoff format.
"""

from __future__ import annotations

import importlib.metadata

from flow.config import StackConfig
from flow.errors import ConfigError, FlowError

__all__ = ["ConfigError", "FlowError", "StackConfig", "__version__"]

try:
    __version__ = importlib.metadata.version("primus-flow")
except importlib.metadata.PackageNotFoundError:  # running from a source tree without install
    __version__ = "0+unknown"
