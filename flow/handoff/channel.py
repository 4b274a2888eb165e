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
    FEATURES_FILE,
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
from flow.handoff.log import (
    CLOSED_MARK,
    Checkpoint,
    CommitLog,
    claim,
    fold,
    next_seq,
    read_checkpoint,
    seq_claim,
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
        self._log: CommitLog | None = None
        self._checkpoint: Checkpoint | None = None
        """The checkpoint as this process last wrote or read it (writers: interval, watermark)."""

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

    def features(self) -> dict[str, Any] | None:
        """What the stage that created the channel recorded of its features (spec, fitted
        state, raw input types, example rows: ``flow.transform.ServingFeatures`` as plain
        data); None for a channel created without it."""
        if not self.folder.exists(FEATURES_FILE):
            return None
        found: dict[str, Any] = json.loads(self.folder.read_bytes(FEATURES_FILE))
        return found

    @property
    def log(self) -> CommitLog:
        """This channel's commit log as this process sees it (:mod:`flow.handoff.log`);
        :meth:`CommitLog.refresh` looks for new commits."""
        if self._log is None:
            self._log = CommitLog(self.folder)
        return self._log

    def commit_ids(self) -> list[int]:
        """Every commit's batch id, in order: from the checkpoint and the writers' heads (an old
        channel's from a listing of its records)."""
        self.log.refresh()
        return self.log.ids()

    def commit(self, batch_id: int) -> Commit:
        """The commit of ``batch_id``: its record, or the checkpoint's copy once retention
        deleted the record."""
        try:
            return Commit.from_json(
                self.folder.child(COMMITS).read_bytes(commit_name(batch_id)).decode()
            )
        except FileNotFoundError:
            found = self.log.commit(batch_id)
            if found is None:
                self.log.load()
                found = self.log.commit(batch_id)
            if found is None:
                raise
            return found

    def retired(self, batch_id: int) -> bool:
        """Whether retention deleted this commit's shards (every consumer had read them)."""
        return self.log.retired(batch_id) or self.folder.child(COMMITS).exists(
            f"{batch_id:020d}{_RETIRED}"
        )

    def retired_ids(self) -> set[int]:
        marked = {int(n.removesuffix(_RETIRED)) for n in self.folder.child(COMMITS).list(_RETIRED)}
        return marked | {b for b in self.log.ids(upto=self._watermark()) if self.log.retired(b)}

    def _watermark(self) -> int:
        self.log.ensure()
        checkpoint = self.log.checkpoint
        return checkpoint.retired_upto if checkpoint is not None else -1

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
        units: Mapping[str, Mapping[str, Any]] | None = None,
        features: Mapping[str, Any] | None = None,
    ) -> ChannelMeta:
        """Create the channel, or check that the existing one has this schema and bucket count.

        ``features`` (plain data, see :meth:`features`) is written with a new channel only: like
        the layout, it belongs to the rows' schema and state, which the channel keeps."""
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
            units={k: dict(v) for k, v in units.items()} if units else None,
        )
        if features is not None:
            # Before the channel file: a channel that exists has its features already.
            self.folder.write_bytes(FEATURES_FILE, json.dumps(features, indent=1).encode())
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
        if self.folder.child(COMMITS).exists(commit_name(batch_id)):
            return True
        self.log.refresh()
        return self.log.has(batch_id)

    def add_commit(self, commit: Commit) -> Commit | None:
        """Make the commit's shards visible: the commit as written, numbered in its writer's
        sequence; None (and nothing changed) if the batch id is already committed.

        Every shard must exist with its recorded size: a commit never names a missing file.
        The commit gets the next ``seq`` of its writer after the writer's head and after any
        claim of the writer found past the head (a writer stopped between record and head:
        :func:`flow.handoff.log.next_seq`), so a commit lost at the end of the sequence is not
        numbered over. Nothing is listed: the cost does not grow with the channel's length.
        Every :data:`~flow.handoff.log.CHECKPOINT_INTERVAL` commits of the writer, the log is
        folded into a new checkpoint. Files of the batch's folder the commit does not name
        (failed or speculative task attempts) are deleted: afterwards a shard no commit names
        is a problem ``verify`` reports.
        """
        if self.folder.child(COMMITS).exists(commit_name(commit.batch_id)):
            self._repair_head(commit.batch_id)
            return None
        checkpoint = self._writing_checkpoint()
        last_seq, last_batch = next_seq(
            self.folder, commit.writer, self.head(commit.writer), checkpoint
        )
        late = last_batch is not None and commit.batch_id <= last_batch
        if late or commit.batch_id <= checkpoint.retired_upto:
            if self.committed(commit.batch_id):  # a replay of a commit retention folded
                return None
            raise HandoffError(
                f"cannot commit batch {commit.batch_id} of writer {commit.writer!r} to channel "
                f"{self.name!r}: the writer's last commit is batch {last_batch} (seq "
                f"{last_seq}) and batches up to {checkpoint.retired_upto} are retired, so batch "
                f"{commit.batch_id} comes too late, and its record is not there; run "
                "`flow handoff verify` on the channel"
            )
        for shard in commit.shards:
            info = self.folder.fs.get_file_info(f"{self.folder.path}/{shard.path}")
            if info.type != pafs.FileType.File or info.size != shard.bytes:
                raise HandoffError(
                    f"cannot commit batch {commit.batch_id}: shard {shard.path} is missing or "
                    "has the wrong size"
                )
        seq = last_seq + 1
        numbered = replace(
            commit,
            seq=seq,
            previous=last_batch,
            total_rows=commit.rows,
            format=FORMAT_VERSION,
        )
        # Claim, record, head: a writer stopped between two of them is read right by the next
        # add_commit (see flow.handoff.log's crash safety).
        claim(self.folder, commit.writer, seq, commit.batch_id)
        self.folder.child(COMMITS).write_bytes(
            commit_name(commit.batch_id), numbered.to_json().encode()
        )
        head = WriterHead(commit.writer, seq, commit.batch_id)
        self.folder.child(WRITERS).write_bytes(head_name(commit.writer), head.to_json().encode())
        self._sweep(numbered)
        if (seq + 1) % checkpoint.interval == 0:
            self._checkpoint = fold(self.folder)
        return numbered

    def _writing_checkpoint(self) -> Checkpoint:
        """The checkpoint a writer numbers against; an old channel's first write folds its
        records into the first one (the automatic upgrade, once)."""
        if self._checkpoint is None:
            self._checkpoint = read_checkpoint(self.folder) or fold(self.folder)
        return self._checkpoint

    def _repair_head(self, batch_id: int) -> None:
        """A replayed batch whose record exists: if its writer stopped before writing the head,
        write it now, so followers (who learn of commits from heads) see the commit."""
        try:
            record = Commit.from_json(
                self.folder.child(COMMITS).read_bytes(commit_name(batch_id)).decode()
            )
        except (FileNotFoundError, ValueError, TypeError, KeyError):
            return
        if record.seq is None:
            return
        head = self.head(record.writer)
        if head is None or head.seq < record.seq:
            fixed = WriterHead(record.writer, record.seq, record.batch_id)
            self.folder.child(WRITERS).write_bytes(
                head_name(record.writer), fixed.to_json().encode()
            )

    def _sweep(self, commit: Commit) -> None:
        folder = self.folder.child(SHARDS, f"{commit.batch_id:020d}")
        named = {s.path.rsplit("/", 1)[-1] for s in commit.shards}
        for name in folder.list():
            if name not in named:
                with contextlib.suppress(FileNotFoundError):
                    self.folder.fs.delete_file(f"{folder.path}/{name}")

    def close(self) -> None:
        """Tell followers the producer has finished; they end after the last commit."""
        stamp = datetime.now(UTC).isoformat().encode()
        self.folder.write_bytes(CLOSED_FILE, stamp)
        # Also among the heads: a follower's one LIST of writers/ sees heads and close together.
        self.folder.child(WRITERS).write_bytes(CLOSED_MARK, stamp)

    def reopen(self) -> None:
        """A producer writes again (a live stage restarted after ``flow run`` closed it)."""
        self.folder.child(WRITERS).delete(CLOSED_MARK)
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
        self.log.refresh()
        marked = self.folder.child(COMMITS).list(_RETIRED)  # an old channel's retention
        if marked:
            done = max(done, max(int(n.removesuffix(_RETIRED)) for n in marked))
        return self.log.unconsumed_bytes(done)

    def retire(self) -> int:
        """Delete what every consumer group has read: its shards, its commit records and its
        sequence claims, after folding those commits into a checkpoint (which keeps their row
        counts, so every reader's plan stays the same). Returns the bytes freed."""
        done = self.consumed_by_all()
        before = self._writing_checkpoint()
        if done <= before.retired_upto:
            return 0
        self._checkpoint = folded = fold(self.folder)
        log = CommitLog(self.folder)
        log.load()
        # Only what the checkpoint holds: a commit past a gap stays a record (and unretired).
        unfolded = [b for b in log.ids(before.retired_upto, done) if not log.folded(b)]
        watermark = min(done, unfolded[0] - 1) if unfolded else done
        if watermark <= before.retired_upto:
            return 0
        self._checkpoint = marked = fold(self.folder, retire_upto=watermark)
        if read_checkpoint(self.folder) != marked:  # another writer folded meanwhile: next time
            return 0
        del folded
        freed = 0
        records = self.folder.child(COMMITS)
        for batch_id in log.ids(before.retired_upto, watermark):
            commit = log.commit(batch_id)
            if commit is None:
                continue
            for shard in commit.shards:
                with contextlib.suppress(FileNotFoundError):
                    self.folder.fs.delete_file(f"{self.folder.path}/{shard.path}")
            self.folder.child(SHARDS, f"{batch_id:020d}").remove()
            records.delete(commit_name(batch_id))
            records.delete(f"{batch_id:020d}{_RETIRED}")
            if commit.seq is not None:
                seq_claim(self.folder, commit.writer).delete(f"{commit.seq:020d}")
            freed += commit.bytes
        self._log = None
        return freed

    def wait_for_room(
        self,
        progress: Callable[[str], None] = lambda _: None,
        poll: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> float:
        """Block while unread bytes exceed the channel's bound (backpressure); seconds waited
        (the pauses, not retention's own work: a slow fold is not a consumer lagging).

        ``sleep`` pauses between looks (tests pass one that lets the consumer catch up)."""
        bound = self.meta().max_unconsumed_bytes
        if bound is None:
            return 0.0
        waited = 0.0
        last_said = 0.0
        while True:
            waiting = self.unconsumed_bytes()
            # Retire after measuring: what the measure counted as read is deleted before the
            # writer goes on, even if the consumer records its last position in between.
            self.retire()
            if waiting <= bound:
                return waited
            if time.monotonic() - last_said > 10:
                progress(
                    f"channel {self.name}: {waiting / 1e6:,.0f} MB unread, above the bound of "
                    f"{bound / 1e6:,.0f} MB; waiting for consumers"
                )
                last_said = time.monotonic()
            paused = time.monotonic()
            sleep(poll)
            waited += time.monotonic() - paused
