"""The handoff format: a channel is a folder of Arrow IPC shards and one commit record per batch.

    <location>/<channel>/_channel.json                         schema, buckets, layout
    <location>/<channel>/shards/<batch:020d>/<bucket>-<task>-<id>.arrow
    <location>/<channel>/commits/<batch:020d>.json             the shards of one batch
    <location>/<channel>/writers/<hash of writer>.json         a writer's latest commit
    <location>/<channel>/consumers/<group>/rank-<r>-of-<w>.json what a consumer has read
    <location>/<channel>/_closed                               the producer has finished

A shard exists for readers only once a commit names it. Commits are written by the driver after
every shard of the batch exists; writing a commit for a batch id already committed is a no-op.

Format 2 numbers commits: each records its writer, its place in that writer's sequence (``seq``
0, 1, 2, ... with no holes) and the batch id of the one before (``previous``), and each writer's
head records its latest commit, written after the commit itself. A missing commit is then
visible from the ones that exist (see :mod:`flow.handoff.sequence`). Format 1 commits carry no
numbers: they are read as before, and cannot be checked for gaps.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

__all__ = [
    "FORMAT_VERSION",
    "ChannelMeta",
    "Commit",
    "ShardInfo",
    "WriterHead",
    "commit_name",
    "head_name",
    "schema_fingerprint",
]

FORMAT_VERSION = 2
"""2: commits are numbered per writer (``seq``, ``previous``, ``total_rows``; writers' heads)."""
CHANNEL_FILE = "_channel.json"
FEATURES_FILE = "_features.json"
"""What made the channel's rows, for a model serving on raw events (written before CHANNEL_FILE;
flow.transform.ServingFeatures reads it, the handoff never does)."""
CLOSED_FILE = "_closed"
COMMITS = "commits"
SHARDS = "shards"
CONSUMERS = "consumers"
WRITERS = "writers"


def commit_name(batch_id: int) -> str:
    return f"{batch_id:020d}.json"


def head_name(writer: str) -> str:
    """The file of a writer's head: writer ids hold characters (``:``, ``/``) a path should not."""
    return f"{hashlib.sha256(writer.encode()).hexdigest()[:16]}.json"


def schema_fingerprint(schema: pa.Schema) -> str:
    """Identifies a schema (names, types, nullability), not its metadata."""
    plain = schema.remove_metadata()
    return hashlib.sha256(plain.serialize().to_pybytes()).hexdigest()[:16]


def _now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(frozen=True)
class ShardInfo:
    """One Arrow IPC file of a commit."""

    path: str
    """Relative to the channel folder."""
    bucket: int
    rows: int
    bytes: int
    checksum: str
    """XXH3-64 of the whole file (hex): a truncated or corrupted shard is detected on read.
    (XXH3 hashes at ~15 GB/s here, CRC-32 at ~3.5: verifying every read costs little.)"""


@dataclass(frozen=True)
class Commit:
    """The shards of one batch, and where their rows came from."""

    channel: str
    batch_id: int
    shards: tuple[ShardInfo, ...]
    schema_fingerprint: str
    committed_at: str = field(default_factory=_now)
    source_positions: dict[str, Any] = field(default_factory=dict)
    """Kafka offsets, Iceberg snapshot ids: what this batch read."""
    event_time: dict[str, str | None] = field(default_factory=dict)
    """{"min": ..., "max": ...} of the rows' event time, ISO strings."""
    writer: str = ""
    """Who committed: one writer per channel, so reset batch ids cannot pass for replays."""
    stats: dict[str, float] = field(default_factory=dict)
    """Small facts about the rows (e.g. positives) a report wants without reading them."""
    seq: int | None = None
    """Place in its writer's sequence of commits to this channel: 0, 1, 2, ... with no holes (a
    batch with no rows is a commit too). Set by :meth:`Channel.add_commit`; None in format 1."""
    previous: int | None = None
    """Batch id of the writer's commit at ``seq - 1`` (None at seq 0): names what a gap lost."""
    total_rows: int | None = None
    """Rows of all shards, as counted when committed: a shard entry edited or dropped since
    makes the shards disagree with it."""
    format: int = FORMAT_VERSION

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def numbered(self) -> bool:
        """Whether the commit has a place in its writer's sequence (format 2)."""
        return self.seq is not None

    def disagreement(self) -> str | None:
        """How the record contradicts itself (its total is not its shards' sum), or None."""
        if self.total_rows is None or self.total_rows == self.rows:
            return None
        return (
            f"commit {self.batch_id} records {self.total_rows:,} rows but its "
            f"{len(self.shards)} shards hold {self.rows:,}: the record was edited or damaged"
        )

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, default=str)

    @classmethod
    def from_json(cls, text: str) -> Commit:
        data = json.loads(text)
        data["shards"] = tuple(ShardInfo(**s) for s in data["shards"])
        return cls(**data)


@dataclass(frozen=True)
class WriterHead:
    """A writer's latest commit to a channel, written after that commit's record.

    It never runs ahead of the records by itself, so a head naming a commit that is not there
    means the end of the writer's sequence was lost (which ``seq`` alone cannot show)."""

    writer: str
    seq: int
    batch_id: int
    updated_at: str = field(default_factory=_now)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> WriterHead:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class ChannelMeta:
    """What every shard of a channel has in common."""

    name: str
    schema: pa.Schema
    num_buckets: int
    compression: str | None = "lz4"
    compression_level: int | None = None
    """The codec's level; None: the handoff's default (LZ4 at acceleration 2, ZSTD at 1)."""
    layout: dict[str, Any] | None = None
    """The feature layout (flow.pipeline.Layout.to_dict()): how a trainer sizes its model."""
    feature_state: str | None = None
    """Version of the fitted feature state the rows were made with."""
    units: dict[str, dict[str, Any]] | None = None
    """Per dense feature, how its stored values map back to its raw column's units
    (flow.pipeline.state.raw_units: ``column``, ``mean``, ``std``, ``log``, ``clip``), for
    statistics a person reads. None: not recorded (a channel written outside a pipeline stage,
    or before channels recorded it); its values are then reported as stored."""
    max_unconsumed_bytes: int | None = None
    """Backpressure: the writer waits while consumers have more than this left to read."""
    labels: dict[str, str] | None = None
    """How the rows were labelled: ``strategy`` (``window``: a row leaves once its label is
    final; ``immediate``: every event at once as a negative, and again as a positive when its
    label event comes, which a trainer corrects for) and the label ``window``. None: unlabelled,
    or written before channels said (read as ``window``)."""
    created_at: str = field(default_factory=_now)
    format: int = FORMAT_VERSION

    @property
    def fingerprint(self) -> str:
        return schema_fingerprint(self.schema)

    @property
    def label_strategy(self) -> str:
        """``immediate`` or ``window`` (the default, and what older channels hold)."""
        return (self.labels or {}).get("strategy", "window")

    def to_json(self) -> str:
        data = asdict(self)
        data["schema"] = base64.b64encode(self.schema.serialize().to_pybytes()).decode()
        data["schema_fingerprint"] = self.fingerprint
        data["columns"] = {f.name: str(f.type) for f in self.schema}
        return json.dumps(data, indent=1, default=str)

    @classmethod
    def from_json(cls, text: str) -> ChannelMeta:
        data = json.loads(text)
        data.pop("schema_fingerprint", None)
        data.pop("columns", None)
        data["schema"] = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(data["schema"])))
        return cls(**data)
