"""A row-level audit of what trainers read, written as they go, and its proof against a channel.

Each rank of a trainer names every row it trains on by a stable **row id**: a 64-bit hash of the
row's key (the channel's label key, e.g. the impression id, carried from the source) and its
label, so an immediate channel's negative and positive rows of one impression are two rows
(:func:`row_ids`). It keeps them in an :class:`AuditWriter`, which writes one small Arrow file
(``part-<rank>-<run>-<seq>.arrow``: the row ids, uint64, and their channel) each time the
trainer saves a checkpoint and at the run's end, atomically (a temporary file, fsynced, then
renamed), the part before the checkpoint. A part holds exactly the rows its checkpoint's cursor
counts as read, so a killed run leaves the audit of every checkpoint it saved, and the run that
resumes from the last one continues both the cursor and the audit: the rows a killed run
trained on after its last checkpoint are read again, as the cursor says, and audited once (a
run killed between a part and its checkpoint leaves a part past the step the next run resumes
from: :func:`read_audit` leaves it out, since that training was lost too).

:func:`prove` checks an audit against the rows the channel holds (:func:`channel_row_ids`):
every row read exactly once across runs and resumes, or the duplicates and gaps by row id.
``flow handoff verify LOCATION CHANNEL --audit DIR`` runs it.

A channel with no key column has no row identity to prove: its rows are audited by a
fingerprint of their values instead (the trainer's, ``id_kind = "fingerprint"``), which tells
rows apart only as far as their values differ, and :func:`prove` refuses it.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flow.errors import ConfigError
from flow.handoff.channel import Channel
from flow.handoff.rowid import bytes_hashes, mix
from flow.handoff.shards import read_shard

__all__ = [
    "AuditProof",
    "AuditWriter",
    "IdKind",
    "channel_row_ids",
    "key_row_ids",
    "prove",
    "prove_channel",
    "read_audit",
    "row_ids",
]

IdKind = Literal["key", "fingerprint"]

_SCHEMA = pa.schema([("row_id", pa.uint64()), ("channel", pa.dictionary(pa.int32(), pa.string()))])
_KIND = b"flow.audit.id_kind"
_STEP = b"flow.audit.step"
_RESUMED = b"flow.audit.resumed_from"
_LABEL_SALT = np.uint64(0x9E3779B97F4A7C15)
_NO_KEY = np.iinfo(np.int64).min
"""trainers.data.NO_KEY: a null key's hash, which no key's hash is left as."""
_BYTES = (
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_binary,
    pa.types.is_large_binary,
)


def key_row_ids(keys: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Row ids from the keys' int64 hashes (trainers.data.key_hashes, what the trainer's
    batches carry) and the labels (float64)."""
    label_bits = labels.astype(np.float64, copy=False).view(np.uint64)
    with np.errstate(over="ignore"):
        ids: np.ndarray = mix(keys.view(np.uint64) ^ mix(label_bits + _LABEL_SALT))
    return ids


def row_ids(key: pa.Array | pa.ChunkedArray, label: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The stable id (uint64) of each row: its key (a string or integer column) and its label,
    hashed as the trainer hashes them. A null key is refused: the row could not be told from
    another."""
    if isinstance(key, pa.ChunkedArray):
        key = key.combine_chunks()
    if isinstance(label, pa.ChunkedArray):
        label = label.combine_chunks()
    if key.null_count:
        raise ConfigError(
            f"{key.null_count} row(s) have no key: an audit names rows by their key; give every "
            "row one"
        )
    if pa.types.is_integer(key.type):
        keys = mix(key.cast(pa.int64()).to_numpy().view(np.uint64))
    elif any(is_kind(key.type) for is_kind in _BYTES):
        keys = bytes_hashes(key)
    else:
        raise ConfigError(f"a row key is a string or an integer column, not {key.type}")
    hashes = keys.view(np.int64)
    hashes[hashes == _NO_KEY] = _NO_KEY + 1  # as trainers.data.key_hashes keeps it for nulls
    # The label's float64 bits: an immediate channel's 0.0 and 1.0 rows of one key differ.
    labels = label.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
    return key_row_ids(hashes, labels)


@dataclass
class AuditWriter:
    """One rank's audit: row ids kept as they are read, a part written at each :meth:`flush`."""

    folder: Path
    rank: int
    id_kind: IdKind = "key"
    resumed_from: int | None = None
    """The checkpoint step this run resumed from (None: it started from nothing): the parts of
    earlier runs past that step are the reads of steps whose training was lost, read again now."""
    run: str = field(default_factory=lambda: f"{time.time_ns():020d}-{uuid.uuid4().hex[:6]}")
    """Orders a resumed run's parts after the run before it (nanoseconds since the epoch)."""
    _pending: list[tuple[np.ndarray, str]] = field(default_factory=list)
    _parts: int = 0

    def add(self, ids: np.ndarray, channel: str) -> None:
        """Rows read (not yet written: :meth:`flush` writes them)."""
        self._pending.append((ids.astype(np.uint64, copy=False), channel))

    def flush(self, step: int) -> Path | None:
        """Write the rows added since the last flush as one part, the rows of the steps up to
        ``step`` (none added: nothing written)."""
        if not self._pending:
            return None
        ids = np.concatenate([i for i, _ in self._pending])
        names = sorted({c for _, c in self._pending})
        which = np.repeat(
            np.array([names.index(c) for _, c in self._pending], np.int32),
            [len(i) for i, _ in self._pending],
        )
        channels = pa.DictionaryArray.from_arrays(pa.array(which), pa.array(names, pa.string()))
        metadata = {_KIND: self.id_kind.encode(), _STEP: str(step).encode()}
        if self.resumed_from is not None:
            metadata[_RESUMED] = str(self.resumed_from).encode()
        table = pa.table(
            {"row_id": pa.array(ids, pa.uint64()), "channel": channels},
            schema=_SCHEMA.with_metadata(metadata),
        )
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"part-{self.rank:05d}-{self.run}-{self._parts:06d}.arrow"
        _write_atomically(path, table)
        self._parts += 1
        self._pending = []
        return path


def _write_atomically(path: Path, table: pa.Table) -> None:
    """A reader finds the whole part or none: written aside, synced, renamed, the folder
    synced (the rename itself survives a crash)."""
    temporary = path.with_suffix(".tmp")
    with pa.OSFile(str(temporary), "wb") as sink, pa.ipc.new_file(sink, table.schema) as out:
        out.write_table(table)
    with open(temporary, "rb+") as written:
        os.fsync(written.fileno())
    os.replace(temporary, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


@dataclass(frozen=True)
class _Part:
    rank: int
    run: str
    step: int
    resumed_from: int | None
    table: pa.Table


def _part(path: Path) -> _Part:
    with pa.memory_map(str(path)) as source:
        table = pa.ipc.open_file(source).read_all()
    meta = table.schema.metadata or {}
    _, rank, started, tag, _ = path.stem.split("-")
    resumed = meta.get(_RESUMED)
    return _Part(
        int(rank),
        f"{started}-{tag}",
        int(meta.get(_STEP, b"0")),
        None if resumed is None else int(resumed),
        table,
    )


def read_audit(folder: Path, rank: int | None = None) -> pa.Table:
    """The reads an audit proves (of one rank, or all), in the order each rank wrote them:
    ``row_id``, ``channel``. A part of a run is left out when a later run resumed from a
    checkpoint before its step: the training of those steps was lost with the run that read
    them, and the later run reads their rows again. The schema metadata says the id kind;
    parts of two kinds are refused."""
    pattern = "part-*.arrow" if rank is None else f"part-{rank:05d}-*.arrow"
    parts = [_part(path) for path in sorted(folder.glob(pattern))]
    resumes = [(p.run, p.resumed_from) for p in parts if p.resumed_from is not None]
    kept = [
        p.table for p in parts if not any(run > p.run and p.step > step for run, step in resumes)
    ]
    if not kept:
        return _SCHEMA.empty_table()
    kinds = {(t.schema.metadata or {}).get(_KIND, b"key") for t in kept}
    if len(kinds) > 1:
        raise ConfigError(
            f"audit {folder} mixes row ids of kinds {sorted(k.decode() for k in kinds)}; audit "
            "each into a folder of its own"
        )
    joined = pa.concat_tables([t.replace_schema_metadata(None) for t in kept])
    return joined.replace_schema_metadata({_KIND: kinds.pop()})


def channel_row_ids(channel: Channel, key: str, label: str = "label") -> np.ndarray:
    """The row ids of every row ``channel``'s commits hold, as :func:`row_ids` makes them."""
    found: list[np.ndarray] = []
    for batch_id in channel.commit_ids():
        for shard in channel.commit(batch_id).shards:
            table = read_shard(channel.folder, shard, commit=batch_id)
            for name in (key, label):
                if name not in table.schema.names:
                    raise ConfigError(
                        f"channel {channel.name}: its rows have no column {name!r} to name them "
                        "by; audit a channel whose rows carry their key"
                    )
            found.append(row_ids(table.column(key), table.column(label)))
    return np.concatenate(found) if found else np.empty(0, np.uint64)


@dataclass(frozen=True)
class AuditProof:
    """What an audit says of a channel's rows: read once each, or which were not."""

    rows: int
    """Rows the channel holds."""
    read: int
    """Rows the audit names."""
    duplicates: dict[int, int]
    """Row id -> times read, for rows read more often than the channel holds them."""
    gaps: dict[int, int]
    """Row id -> times never read, for rows the channel holds that the audit misses."""

    @property
    def exactly_once(self) -> bool:
        return not self.duplicates and not self.gaps

    def lines(self, limit: int = 5) -> list[str]:
        """One line for the verdict, one per kind of problem naming its first row ids."""
        if self.exactly_once:
            return [f"audit: each of {self.rows:,} rows read exactly once"]
        said = [f"audit: {self.read:,} reads of {self.rows:,} rows, NOT exactly once"]
        for what, found in (("read more than once", self.duplicates), ("never read", self.gaps)):
            if found:
                named = ", ".join(f"{i:016x}" for i in sorted(found)[:limit])
                more = f" and {len(found) - limit:,} more" if len(found) > limit else ""
                said.append(f"  {len(found):,} row(s) {what}: {named}{more}")
        return said


def prove(audit: pa.Table | Iterable[np.ndarray], channel_ids: np.ndarray) -> AuditProof:
    """Each row of the channel read exactly once by the audit (all ranks, runs and resumes):
    counts of every row id compared, so rows the channel holds twice must be read twice."""
    if isinstance(audit, pa.Table):
        kind = (audit.schema.metadata or {}).get(_KIND, b"key")
        if kind != b"key":
            raise ConfigError(
                "the audit names rows by a fingerprint of their values (the channel has no key "
                "column), which cannot prove row identity; audit a channel whose rows carry a key"
            )
        read = pc.cast(audit.column("row_id"), pa.uint64()).to_numpy()
    else:
        parts = list(audit)
        read = np.concatenate(parts) if parts else np.empty(0, np.uint64)
    every = np.unique(np.concatenate([read, channel_ids]).astype(np.uint64))
    times = _counts(every, read)
    held = _counts(every, channel_ids.astype(np.uint64))
    over, under = times > held, times < held
    duplicates = dict(zip(every[over].tolist(), times[over].tolist(), strict=True))
    gaps = dict(zip(every[under].tolist(), (held - times)[under].tolist(), strict=True))
    return AuditProof(len(channel_ids), len(read), duplicates, gaps)


def _counts(every: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """How often each of ``every`` (sorted, unique) occurs in ``ids``."""
    return np.bincount(np.searchsorted(every, ids), minlength=len(every))


def prove_channel(channel: Channel, audit: Path, key: str | None = None) -> AuditProof:
    """The audit in folder ``audit`` (every rank, run and resume) proved against ``channel``'s
    rows; its rows named by ``key`` (default: the label key its metadata records)."""
    column = key or (channel.meta().labels or {}).get("key")
    if not column:
        raise ConfigError(
            f"channel {channel.name} records no row key; name the column that names its rows "
            "(--key impression_id)"
        )
    found = read_audit(audit)
    if not found.num_rows:
        raise ConfigError(f"{audit} holds no audit parts; train with --audit-dir {audit}")
    mine = found.filter(pc.equal(found.column("channel").cast(pa.string()), channel.name))
    return prove(mine, channel_row_ids(channel, column))
