"""How a rank reads a channel (:class:`ReadOptions`) and what it has done (:class:`ReadStats`)."""

from __future__ import annotations

from dataclasses import dataclass

from flow.errors import ConfigError

__all__ = ["ReadOptions", "ReadStats"]


@dataclass(frozen=True)
class ReadOptions:
    """How a rank reads a channel."""

    batch_size: int = 4096
    window_rows: int | None = None
    """Rows permuted together (default 16 batches). Memory is bounded by this, not the data."""
    shuffle: bool = True
    seed: int = 0
    follow: bool = False
    """Keep reading new commits as they land; end when the channel is closed."""
    whole_commits: bool = True
    """Following: yield every commit's rows before waiting for the next commit, the commit's
    last batch smaller than ``batch_size`` where they do not fill it (the same sizes on every
    rank). Off: batches are always full, and a commit's rows short of one wait for the next
    commit (at a 10 s trigger, 10 s more for about a batch of rows each commit)."""
    poll_interval: float = 0.05
    """Seconds between looks for new commits while following."""
    missing_commit_wait: float = 60.0
    """Following: seconds to wait for a commit its writer's sequence says exists but that is not
    there yet (a store that lists late) before raising MissingCommitError. A finite epoch raises
    at once, before its first batch."""
    verify: bool = True
    """Check every shard's checksum (XXH3, ~15 GB/s) before reading it."""
    consumer_group: str | None = None
    """Record this rank's position under this name, for retention and backpressure."""
    record_every: float = 5.0
    prefetch: int = 2
    """Windows' worth of rows whose shards are opened (read, checked, decompressed) ahead of use
    by background threads; 0: none. Memory grows by up to this many windows of rows."""
    threads: int = 2
    """Threads that open shards ahead of use. pyarrow releases the GIL while it reads, checks
    and decompresses, so each thread can use a core: a GPU trainer reading millions of rows a
    second wants several (see docs/benchmarks.md, "The GPU path")."""
    after_commit: int = -1
    """Read only the commits after this batch id (e.g. what arrived since the last training)."""
    buckets: frozenset[int] | None = None
    """Read only these buckets (a held-out slice, say); None: all of them. Every rank of a world
    gets an equal share of the chosen buckets' rows, as with all of them."""

    def __post_init__(self) -> None:
        if self.buckets is not None and self.consumer_group is not None:
            raise ConfigError(
                "a reader of some buckets cannot record consumption for retention (the rest "
                "would count as unread, or as read); leave consumer_group unset with buckets"
            )
        if self.poll_interval <= 0:
            raise ConfigError(
                f"poll_interval={self.poll_interval}: give a positive number of seconds"
            )
        if self.missing_commit_wait < 0:
            raise ConfigError(
                f"missing_commit_wait={self.missing_commit_wait}: give 0 or more seconds"
            )
        if self.threads < 1:
            raise ConfigError(f"threads={self.threads}: give 1 or more decoding threads")
        if self.window_rows is not None and self.window_rows <= self.batch_size:
            raise ConfigError(
                f"window_rows={self.window_rows} must exceed batch_size={self.batch_size}"
            )

    @property
    def window(self) -> int:
        return self.window_rows or 16 * self.batch_size


@dataclass
class ReadStats:
    """What a reader has done so far: progress and shuffle quality."""

    batches: int = 0
    rows: int = 0
    shards_opened: int = 0
    distinct_shards: int = 0
    """Sum, over sampled batches, of the number of shards a batch's rows came from."""
    sampled: int = 0
    undelivered: int = 0
    """Rows a closed channel left that no batch could take without unbalancing the ranks."""

    @property
    def shards_per_batch(self) -> float:
        """Shuffle quality: distinct source shards in a batch, on average."""
        return self.distinct_shards / self.sampled if self.sampled else 0.0
