"""A channel of a handoff location: its metadata, commits, consumers and retention."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyarrow import fs as pafs

from flow.errors import ChannelNotFoundError, HandoffError, SchemaMismatchError
from flow.handoff.format import (
    CHANNEL_FILE,
    CLOSED_FILE,
    COMMITS,
    CONSUMERS,
    FORMAT_VERSION,
    SHARDS,
    WRITERS,
    ChannelMeta,
    Commit,
    ShardInfo,
    WriterHead,
    commit_name,
    head_name,
)
from flow.handoff.shards import codec, fixed_size_lists, write_shard
from flow.handoff.verify import VerifyReport, verify_channel
from flow.storage import Location, location

__all__ = ["Channel", "ConsumerPosition", "list_channels"]

_RETIRED = ".retired"


def _as_location(where: str | Location) -> Location:
    return where if isinstance(where, Location) else location(where)


def list_channels(where: str | Location) -> list[str]:
    root = _as_location(where)
    return [name for name in root.list(folders=True) if root.child(name).exists(CHANNEL_FILE)]


def describe_schema_difference(expected: pa.Schema, actual: pa.Schema) -> str:
    wanted = {f.name: f.type for f in expected}
    have = {f.name: f.type for f in actual}
    parts = []
    missing = [n for n in wanted if n not in have]
    extra = [n for n in have if n not in wanted]
    changed = [
        f"{n} ({have[n]}, expected {wanted[n]})"
        for n in wanted
        if n in have and have[n] != wanted[n]
    ]
    if missing:
        parts.append(f"missing {', '.join(missing)}")
    if extra:
        parts.append(f"unexpected {', '.join(extra)}")
    if changed:
        parts.append(f"different types: {', '.join(changed)}")
    return "; ".join(parts) or "same columns, different nullability or order"


@dataclass(frozen=True)
class ConsumerPosition:
    """How far one rank of a consumer group has read a channel."""

    group: str
    rank: int
    world_size: int
    consumed_upto: int
    """Every commit with a batch id up to this one has been read entirely (-1: none yet)."""
    updated_at: str


class Channel:
    """One channel: where writers add commits and readers find them."""

    def __init__(self, where: str | Location, name: str) -> None:
        self.root = _as_location(where)
        self.name = name
        self.folder = self.root.child(name)
        self._meta: ChannelMeta | None = None

    # -- reading ---------------------------------------------------------------------------

    def exists(self) -> bool:
        return self.folder.exists(CHANNEL_FILE)

    def meta(self) -> ChannelMeta:
        if self._meta is None:
            if not self.exists():
                if not self.root.exists():
                    raise ChannelNotFoundError(
                        f"handoff location {self.root} does not exist; check the path, or run the "
                        "pipeline that writes it first"
                    )
                raise ChannelNotFoundError(
                    f"no channel {self.name!r} in {self.root}; channels there: "
                    f"{', '.join(list_channels(self.root)) or 'none'}"
                )
            self._meta = ChannelMeta.from_json(self.folder.read_bytes(CHANNEL_FILE).decode())
        return self._meta

    def commit_ids(self) -> list[int]:
        return [int(n.removesuffix(".json")) for n in self.folder.child(COMMITS).list(".json")]

    def commit(self, batch_id: int) -> Commit:
        return Commit.from_json(
            self.folder.child(COMMITS).read_bytes(commit_name(batch_id)).decode()
        )

    def retired(self, batch_id: int) -> bool:
        """Whether retention deleted this commit's shards (every consumer had read them)."""
        return self.folder.child(COMMITS).exists(f"{batch_id:020d}{_RETIRED}")

    def retired_ids(self) -> set[int]:
        return {int(n.removesuffix(_RETIRED)) for n in self.folder.child(COMMITS).list(_RETIRED)}

    def heads(self) -> dict[str, WriterHead]:
        """Each writer's latest commit, by writer (none for channels of format 1).

        Read heads before listing commits: a head is written after its commit's record, so one
        read first never names a commit still in progress."""
        folder = self.folder.child(WRITERS)
        heads = [WriterHead.from_json(folder.read_bytes(n).decode()) for n in folder.list(".json")]
        return {h.writer: h for h in heads}

    def head(self, writer: str) -> WriterHead | None:
        folder = self.folder.child(WRITERS)
        name = head_name(writer)
        return (
            WriterHead.from_json(folder.read_bytes(name).decode()) if folder.exists(name) else None
        )

    def verify(self, *, in_flight_grace: float = 3600.0) -> VerifyReport:
        """Check the channel against what its commits say it holds (see
        :mod:`flow.handoff.verify`): damaged shards, missing commits, orphan shards, row counts."""
        return verify_channel(self, in_flight_grace=in_flight_grace)

    def closed(self) -> bool:
        return self.folder.exists(CLOSED_FILE)

    def check_schema(self, expected: pa.Schema) -> None:
        actual = self.meta().schema
        if not actual.remove_metadata().equals(expected.remove_metadata()):
            raise SchemaMismatchError(
                f"channel {self.name!r} in {self.root} does not have the expected schema: "
                f"{describe_schema_difference(expected, actual)}"
            )

    # -- writing ---------------------------------------------------------------------------

    def create(
        self,
        schema: pa.Schema,
        *,
        num_buckets: int,
        compression: str | None = "lz4",
        compression_level: int | None = None,
        layout: Mapping[str, Any] | None = None,
        feature_state: str | None = None,
        max_unconsumed_bytes: int | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> ChannelMeta:
        """Create the channel, or check that the existing one has this schema and bucket count."""
        if self.exists():
            meta = self.meta()
            if not meta.schema.remove_metadata().equals(schema.remove_metadata()):
                raise SchemaMismatchError(
                    f"channel {self.name!r} in {self.root} already holds rows of another schema "
                    f"({describe_schema_difference(meta.schema, schema)}); write to a new channel"
                )
            if meta.num_buckets != num_buckets:
                raise HandoffError(
                    f"channel {self.name!r} has {meta.num_buckets} buckets, not {num_buckets}"
                )
            strategy = (labels or {}).get("strategy", "window")
            if labels is not None and strategy != meta.label_strategy:
                raise HandoffError(
                    f"channel {self.name!r} in {self.root} holds rows labelled "
                    f"{meta.label_strategy!r}, not {strategy!r} (a trainer corrects the two "
                    "differently); write to a new channel or keep LabelJoin.strategy"
                )
            return meta
        codec(compression, compression_level)  # a bad codec or level fails before any write
        meta = ChannelMeta(
            name=self.name,
            schema=schema,
            num_buckets=num_buckets,
            compression=compression,
            compression_level=compression_level,
            layout=dict(layout) if layout else None,
            feature_state=feature_state,
            max_unconsumed_bytes=max_unconsumed_bytes,
            labels=dict(labels) if labels else None,
        )
        self.folder.write_bytes(CHANNEL_FILE, meta.to_json().encode())
        self._meta = meta
        return meta

    def write_bucket(self, batch_id: int, bucket: int, table: pa.Table, task: str) -> ShardInfo:
        """Write one shard of ``bucket`` for ``batch_id`` (from a writer task)."""
        meta = self.meta()
        sizes = {
            f.name: f.type.list_size for f in meta.schema if pa.types.is_fixed_size_list(f.type)
        }
        table = fixed_size_lists(table, sizes).select(meta.schema.names).cast(meta.schema)
        name = f"{bucket:05d}-{task}-{uuid.uuid4().hex[:8]}.arrow"
        info = write_shard(
            self.folder.child(SHARDS, f"{batch_id:020d}"),
            name,
            table,
            meta.compression,
            bucket,
            meta.compression_level,
        )
        return ShardInfo(
            f"{SHARDS}/{batch_id:020d}/{name}", bucket, info.rows, info.bytes, info.checksum
        )

    def committed(self, batch_id: int) -> bool:
        return self.folder.child(COMMITS).exists(commit_name(batch_id))

    def add_commit(self, commit: Commit) -> Commit | None:
        """Make the commit's shards visible: the commit as written, numbered in its writer's
        sequence; None (and nothing changed) if the batch id is already committed.

        Every shard must exist with its recorded size: a commit never names a missing file.
        The commit gets the next ``seq`` of its writer after the writer's head (and after any
        commit of the writer found past the head: a writer stopped between record and head),
        so a commit lost at the end of the sequence is not numbered over. Files of the batch's
        folder the commit does not name (failed or speculative task attempts) are deleted:
        afterwards a shard no commit names is a problem ``verify`` reports.
        """
        if self.committed(commit.batch_id):
            return None
        for shard in commit.shards:
            info = self.folder.fs.get_file_info(f"{self.folder.path}/{shard.path}")
            if info.type != pafs.FileType.File or info.size != shard.bytes:
                raise HandoffError(
                    f"cannot commit batch {commit.batch_id}: shard {shard.path} is missing or "
                    "has the wrong size"
                )
        last = self._last_numbered(commit.writer)
        if last is not None and commit.batch_id <= last[1]:
            raise HandoffError(
                f"cannot commit batch {commit.batch_id} of writer {commit.writer!r} to channel "
                f"{self.name!r}: the writer's last commit is batch {last[1]} (seq {last[0]}), so "
                f"batch {commit.batch_id} comes too late, and its record is not there; run "
                "`flow handoff verify` on the channel"
            )
        seq = 0 if last is None else last[0] + 1
        numbered = replace(
            commit,
            seq=seq,
            previous=None if last is None else last[1],
            total_rows=commit.rows,
            format=FORMAT_VERSION,
        )
        self.folder.child(COMMITS).write_bytes(
            commit_name(commit.batch_id), numbered.to_json().encode()
        )
        head = WriterHead(commit.writer, seq, commit.batch_id)
        self.folder.child(WRITERS).write_bytes(head_name(commit.writer), head.to_json().encode())
        self._sweep(numbered)
        return numbered

    def _last_numbered(self, writer: str) -> tuple[int, int] | None:
        """(seq, batch id) of ``writer``'s latest numbered commit; None if it has none."""
        head = self.head(writer)
        ids = self.commit_ids()
        if head is None:
            # No head: the writer's first commit, or the head was never written. The latest
            # commit of the writer decides (seqs grow with batch ids); one of format 1 ends it.
            for batch_id in reversed(ids):
                found = self.commit(batch_id)
                if found.writer == writer:
                    return (found.seq, batch_id) if found.seq is not None else None
            return None
        last = (head.seq, head.batch_id)
        for batch_id in ids:
            if batch_id > head.batch_id:
                found = self.commit(batch_id)
                if found.writer == writer and found.seq is not None and found.seq > last[0]:
                    last = (found.seq, batch_id)
        return last

    def _sweep(self, commit: Commit) -> None:
        folder = self.folder.child(SHARDS, f"{commit.batch_id:020d}")
        named = {s.path.rsplit("/", 1)[-1] for s in commit.shards}
        for name in folder.list():
            if name not in named:
                with contextlib.suppress(FileNotFoundError):
                    self.folder.fs.delete_file(f"{folder.path}/{name}")

    def close(self) -> None:
        """Tell followers the producer has finished; they end after the last commit."""
        self.folder.write_bytes(CLOSED_FILE, datetime.now(UTC).isoformat().encode())

    def reopen(self) -> None:
        """A producer writes again (a live stage restarted after ``flow run`` closed it)."""
        if self.closed():
            self.folder.fs.delete_file(f"{self.folder.path}/{CLOSED_FILE}")

    # -- consumers and retention --------------------------------------------------------------

    def record(self, position: ConsumerPosition) -> None:
        folder = self.folder.child(CONSUMERS, position.group)
        name = f"rank-{position.rank}-of-{position.world_size}.json"
        folder.write_bytes(name, json.dumps(position.__dict__).encode())

    def positions(self) -> dict[str, list[ConsumerPosition]]:
        """Every consumer group's ranks, as last recorded."""
        groups: dict[str, list[ConsumerPosition]] = {}
        folder = self.folder.child(CONSUMERS)
        for name in folder.list(folders=True):
            group = folder.child(name)
            groups[name] = [
                ConsumerPosition(**json.loads(group.read_bytes(n))) for n in group.list(".json")
            ]
        return groups

    def consumed_by_all(self) -> int:
        """The highest batch id every rank of every consumer group has read (-1: none)."""
        upto: list[int] = []
        for ranks in self.positions().values():
            world = ranks[0].world_size if ranks else 1
            latest = {p.rank: p.consumed_upto for p in ranks if p.world_size == world}
            upto.append(min(latest.values()) if len(latest) == world else -1)
        return min(upto) if upto else -1

    def unconsumed_bytes(self) -> int:
        done = self.consumed_by_all()
        return sum(
            self.commit(b).bytes for b in self.commit_ids() if b > done and not self.retired(b)
        )

    def retire(self) -> int:
        """Delete the shards every consumer group has read; the commit records stay (their row
        counts keep every reader's plan the same). Returns the bytes freed."""
        done = self.consumed_by_all()
        freed = 0
        for batch_id in self.commit_ids():
            if batch_id > done or self.retired(batch_id):
                continue
            commit = self.commit(batch_id)
            for shard in commit.shards:
                with contextlib.suppress(FileNotFoundError):
                    self.folder.fs.delete_file(f"{self.folder.path}/{shard.path}")
            self.folder.child(COMMITS).write_bytes(f"{batch_id:020d}{_RETIRED}", b"")
            freed += commit.bytes
        return freed

    def wait_for_room(
        self,
        progress: Callable[[str], None] = lambda _: None,
        poll: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> float:
        """Block while unread bytes exceed the channel's bound (backpressure); seconds waited.

        ``sleep`` pauses between looks (tests pass one that lets the consumer catch up)."""
        bound = self.meta().max_unconsumed_bytes
        if bound is None:
            return 0.0
        started = time.monotonic()
        last_said = 0.0
        while True:
            waiting = self.unconsumed_bytes()
            # Retire after measuring: what the measure counted as read is deleted before the
            # writer goes on, even if the consumer records its last position in between.
            self.retire()
            if waiting <= bound:
                return time.monotonic() - started
            if time.monotonic() - last_said > 10:
                progress(
                    f"channel {self.name}: {waiting / 1e6:,.0f} MB unread, above the bound of "
                    f"{bound / 1e6:,.0f} MB; waiting for consumers"
                )
                last_said = time.monotonic()
            sleep(poll)
