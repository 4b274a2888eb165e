"""Every error Primus Flow raises on purpose.

Each message names what went wrong and what to change. Callers catch :class:`FlowError` to tell
these apart from bugs; the CLI prints them without a traceback.
"""

from __future__ import annotations

__all__ = [
    "ArtifactResolutionError",
    "ChannelNotFoundError",
    "CommitCorruptError",
    "ConfigError",
    "DependencyMissingError",
    "EngineNotFoundError",
    "FlowError",
    "HandoffError",
    "JavaNotFoundError",
    "LoadError",
    "MissingCommitError",
    "PortInUseError",
    "SchemaMismatchError",
    "ServiceError",
    "ServiceStartError",
    "ShardCorruptError",
    "SparkSetupError",
]


class FlowError(Exception):
    """Base class of the errors Primus Flow raises on purpose."""


class ConfigError(FlowError, ValueError):
    """A setting has a value that cannot work; the message names the setting."""


class DeadLetterBudgetError(FlowError):
    """A stage's input has more dead letters than its bound allows: most likely a wrong spec (a
    label column that is not 0/1) or broken input, not a few bad records. Nothing was written;
    the message names the top reason, an example, and the setting that raises the bound."""


class LoadError(FlowError, ValueError):
    """Input data cannot be loaded as it is (``flow load``, ``flow import``); the message names
    the file, the column, the row and value, and the option or the data to change."""


class DependencyMissingError(FlowError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""

    def __init__(self, module: str, extra: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs the Python package '{module}', which is not installed. "
            f"Install it with: pip install 'primus-flow[{extra}]'"
        )
        self.module = module
        self.extra = extra


class JavaNotFoundError(FlowError):
    """No usable Java runtime (17 or newer) was found."""


class ArtifactResolutionError(FlowError):
    """A JVM artifact could not be resolved or downloaded."""

    def __init__(self, message: str, artifacts: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.artifacts = artifacts


class EngineNotFoundError(FlowError):
    """No engine plugin is installed under the requested name."""


class SparkSetupError(FlowError):
    """The Spark session cannot be built with the settings it was given."""


class ServiceError(FlowError):
    """A local service could not be started, stopped or reached."""


class PortInUseError(ServiceError):
    """A port a local service needs is taken by another process."""


class ServiceStartError(ServiceError):
    """A local service exited or did not become ready; the message carries its log's tail."""


class HandoffError(FlowError):
    """The handoff cannot be written or read as asked."""


class ChannelNotFoundError(HandoffError):
    """A handoff location or channel does not exist; the message lists what does."""


class SchemaMismatchError(HandoffError):
    """A channel's schema is not the one its consumer (or a new writer) expects."""


class ShardCorruptError(HandoffError):
    """A committed shard is missing, truncated or does not match its checksum."""


class CommitCorruptError(HandoffError):
    """A commit record contradicts itself (its row total is not the sum of its shards)."""


class MissingCommitError(HandoffError):
    """A commit its writer's sequence says exists is not in the channel: reading on would train
    on less than was committed. The message names the channel, the writer and the commit."""

    def __init__(
        self,
        message: str,
        *,
        channel: str,
        writer: str,
        seqs: tuple[int, ...],
        batch_ids: tuple[int, ...],
    ) -> None:
        super().__init__(message)
        self.channel = channel
        self.writer = writer
        self.seqs = seqs
        """Places in the writer's sequence that are missing."""
        self.batch_ids = batch_ids
        """Their batch ids, where known."""
