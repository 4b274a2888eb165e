"""A channel's commit log whose cost does not grow with its length: checkpoints and heads.

Like Delta's checkpoints and Iceberg's manifest lists. The commit records stay where they were
(``commits/<batch>.json``); next to them a channel that has been written by this version keeps

    log/_checkpoint.json             the latest checkpoint: its segments, each writer's head as
                                     folded, the retired watermark (small: one line a segment)
    log/segments/<id>.arrow          immutable Arrow IPC tables, one row per folded commit
                                     (its writer, seq, previous, rows and shards: all a reader
                                     and a planner need, and the rest of the record as JSON)
    log/seqs/<writer>/<seq:020d>     a writer's claim on a sequence number: the batch id

* **Writers** read their head (one GET) and probe the next sequence numbers (one HEAD each),
  never list. Every :data:`CHECKPOINT_INTERVAL` commits of a writer, it folds the commits since
  the checkpoint into a new segment and writes a new ``_checkpoint.json`` (atomically: a
  temporary file renamed on local disk, one PUT on an object store; see
  :meth:`flow.storage.Location.write_bytes`). Segments pile up as levels: every
  :data:`MERGE_SEGMENTS` small ones are merged into one, so a reader opens few files.
* **Readers** read the checkpoint and its segments once (Arrow: milliseconds for a million
  commits), then each writer's commits after the checkpoint by walking back from the writer's
  head through ``previous``. A follower's idle poll is one LIST of ``writers/`` (the heads and
  the ``_closed`` marker) and one GET per writer.
* **Retention** folds everything up to the watermark into a checkpoint, then deletes those
  commits' shards, records and sequence claims: the checkpoint keeps their rows, so plans stay.
  A retired commit's shard list goes too: a fold rewrites each segment that holds only retired
  commits with one entry a commit (its rows, no path: :func:`_retired_table`), so the log grows
  by what is unretired, not by a shard list a retired commit (7.8 KB with 64 buckets).

A channel without ``log/_checkpoint.json`` (written before) is read by listing ``commits/``, as
before; its first write by this version folds the listing into the first checkpoint.

Crash safety. A commit is, in order: claim (``log/seqs``), record, head, so a writer stopped
between any two steps leaves a state the next :func:`next_seq` reads right: a claim without a
record is taken over (its batch was never visible), a claim with a record is a commit whose head
was not written (the sequence goes on after it, and a replay of its batch repairs the head). A
checkpoint only ever adds to what it replaces; records are deleted only by retention, after the
checkpoint that holds their commits is written and read back.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import time
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from pyarrow import fs as pafs

from flow.handoff.format import COMMITS, WRITERS, Commit, ShardInfo, WriterHead, commit_name
from flow.handoff.format import head_name as writer_key
from flow.storage import Location

__all__ = [
    "CHECKPOINT_FILE",
    "CHECKPOINT_INTERVAL",
    "CLOSED_MARK",
    "LOG",
    "MERGE_SEGMENTS",
    "SEGMENT_GRACE_S",
    "Checkpoint",
    "CommitLog",
    "Links",
    "fold",
    "next_seq",
    "read_checkpoint",
]

CHECKPOINT_INTERVAL = 1000
"""K: a writer folds its channel's log every K of its commits. The cost a reader pays at start
is one segment per K commits (merged, see below) plus up to K records per writer after the
checkpoint; a fold costs K record reads once per K commits (one GET a commit, amortised). At a
5 s trigger, K = 1000 is a checkpoint every ~80 minutes, and a restarted reader reads at most
1000 small records: ~50 ms on local disk. Smaller K makes more segments; larger K a longer
tail."""
MERGE_SEGMENTS = 100
"""Every this many segments of a level are merged into one of the next level: a million
commits make ~10 segments of 100,000 and a few of 1,000, not a thousand files."""
SEGMENT_GRACE_S = 600.0
"""A segment that neither the new checkpoint nor the one before names is deleted at a fold once
it is this old (a merge leaves the segments it merged, and each fold of a retention leaves one
more: 600 files after 1,200 micro-batches of ``flow bench soak``). A reader reads the segments
of the checkpoint it read within moments, and another writer's fold names its new segment in
the checkpoint it writes next: ten minutes covers both."""
LOG = "log"
CHECKPOINT_FILE = "_checkpoint.json"
SEGMENTS = "segments"
SEQS = "seqs"
CLOSED_MARK = "_closed"
"""The producer's close, also in ``writers/``: a follower's one LIST sees heads and close."""
LOG_FORMAT = 3

_SHARD = pa.struct(
    [
        ("path", pa.string()),
        ("bucket", pa.int32()),
        ("rows", pa.int64()),
        ("bytes", pa.int64()),
        ("checksum", pa.string()),
    ]
)
SEGMENT_SCHEMA = pa.schema(
    [
        ("batch_id", pa.int64()),
        ("writer", pa.string()),
        ("seq", pa.int64()),
        ("previous", pa.int64()),
        ("total_rows", pa.int64()),
        ("shards", pa.list_(_SHARD)),
        ("record", pa.string()),
    ]
)
"""A segment: ``record`` is the commit's JSON without its shards (positions, event time, ...)."""


@dataclass(frozen=True)
class Checkpoint:
    """The latest fold of a channel's log."""

    segments: tuple[dict[str, Any], ...] = ()
    """``{"name", "commits", "level", "last"}`` each (``last``: its highest batch id; absent in
    older checkpoints), oldest first; ``"retired": true`` once it holds retired commits only,
    without their shard lists."""
    heads: dict[str, list[int]] = field(default_factory=dict)
    """Each writer's (seq, batch id) as folded: its later commits are read from records."""
    commits: int = 0
    retired_upto: int = -1
    """Every commit folded with a batch id up to this one is retired: shards and record gone."""
    interval: int = CHECKPOINT_INTERVAL
    token: str = ""
    format: int = LOG_FORMAT

    def to_json(self) -> str:
        data = asdict(self)
        data["segments"] = list(self.segments)
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> Checkpoint:
        data = json.loads(text)
        data["segments"] = tuple(data["segments"])
        return cls(**data)


def read_checkpoint(folder: Location) -> Checkpoint | None:
    """The channel's checkpoint; None for a channel written before checkpoints."""
    try:
        return Checkpoint.from_json(folder.child(LOG).read_bytes(CHECKPOINT_FILE).decode())
    except FileNotFoundError:
        return None


def _segment_table(commits: Sequence[Commit]) -> pa.Table:
    records, shards = [], []
    for c in commits:
        data = asdict(c)
        shards.append(data.pop("shards"))
        records.append(json.dumps(data, default=str))
    return pa.table(
        {
            "batch_id": [c.batch_id for c in commits],
            "writer": [c.writer for c in commits],
            "seq": [c.seq for c in commits],
            "previous": [c.previous for c in commits],
            "total_rows": [c.total_rows for c in commits],
            "shards": shards,
            "record": records,
        },
        schema=SEGMENT_SCHEMA,
    )


RETIRED_BUCKET = -1
"""The bucket of a retired commit's one shard entry in a segment: its rows, no file."""


def _retired_table(table: pa.Table) -> pa.Table:
    """``table`` (a segment) with each commit's shard list replaced by one entry: its rows in
    bucket :data:`RETIRED_BUCKET`, no path, no bytes, no checksum. Its shards are deleted, so
    no reader opens them; what a retired commit is still asked for (its rows, writer,
    sequence, stats and source positions: reports, replays, gap checks) stays."""
    if not len(table):
        return table
    shards = table.column("shards").combine_chunks()
    offsets = shards.offsets.to_numpy()
    shard_rows = shards.flatten().field("rows").to_numpy()
    cumulative = np.concatenate([[0], np.cumsum(shard_rows)])
    rows = cumulative[offsets[1:]] - cumulative[offsets[:-1]]
    n = len(table)
    one = pa.StructArray.from_arrays(
        [
            pa.array([""] * n, pa.string()),
            pa.array(np.full(n, RETIRED_BUCKET, np.int32)),
            pa.array(rows.astype(np.int64)),
            pa.array(np.zeros(n, np.int64)),
            pa.array([""] * n, pa.string()),
        ],
        fields=list(_SHARD),
    )
    listed = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), one)
    at = table.schema.get_field_index("shards")
    return table.set_column(at, SEGMENT_SCHEMA.field("shards"), listed)


def _write_segment(
    folder: Location, table: pa.Table, level: int, *, retired: bool = False
) -> dict[str, Any]:
    name = f"{level}-{uuid.uuid4().hex}.arrow"
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as out:
        out.write_table(table)
    folder.child(LOG, SEGMENTS).write_bytes(name, sink.getvalue())
    last = int(np.max(table.column("batch_id").to_numpy())) if len(table) else -1
    return {"name": name, "commits": table.num_rows, "level": level, "last": last} | (
        {"retired": True} if retired else {}
    )


def _read_segment(folder: Location, name: str) -> pa.Table:
    segments = folder.child(LOG, SEGMENTS)
    if isinstance(folder.fs, pafs.LocalFileSystem):  # mapped: a reader never copies records
        return pa.ipc.open_file(pa.memory_map(f"{segments.path}/{name}")).read_all()
    with segments.reading(name) as source:
        return pa.ipc.open_file(source).read_all()


def _read_segments(folder: Location, names: Sequence[str]) -> pa.Table:
    if not names:
        return SEGMENT_SCHEMA.empty_table()
    with ThreadPoolExecutor(8) as pool:  # on an object store each is a GET's latency
        tables = list(pool.map(lambda n: _read_segment(folder, n), names))
    return pa.concat_tables(tables)


def _commit_of(table: pa.Table, row: int) -> Commit:
    one = table.slice(row, 1).to_pylist()[0]
    data = json.loads(one["record"])
    data["shards"] = tuple(ShardInfo(**s) for s in one["shards"])
    return Commit(**data)


def read_record(folder: Location, batch_id: int) -> Commit | None:
    try:
        return Commit.from_json(folder.child(COMMITS).read_bytes(commit_name(batch_id)).decode())
    except FileNotFoundError:
        return None


def read_heads(folder: Location) -> tuple[dict[str, WriterHead], bool]:
    """Every writer's head and whether the channel is closed: one LIST, one GET a writer."""
    writers = folder.child(WRITERS)
    # One request: Location.list asks whether the folder exists first.
    selector = pafs.FileSelector(writers.path, allow_not_found=True)
    names = [
        i.base_name for i in folder.fs.get_file_info(selector) if not i.base_name.startswith(".")
    ]
    heads = {}
    for name in names:
        if name.endswith(".json"):
            try:
                head = WriterHead.from_json(folder.child(WRITERS).read_bytes(name).decode())
            except FileNotFoundError:
                continue
            heads[head.writer] = head
    return heads, CLOSED_MARK in names


# -- writers ---------------------------------------------------------------------------------


def seq_claim(folder: Location, writer: str) -> Location:
    return folder.child(LOG, SEQS, writer_key(writer).removesuffix(".json"))


def next_seq(
    folder: Location, writer: str, head: WriterHead | None, checkpoint: Checkpoint
) -> tuple[int, int | None]:
    """(seq, batch id) of ``writer``'s latest commit, from its head and the claims after it
    (a writer stopped between its record and its head); (-1, None) for a first commit.

    Probes ``log/seqs/<writer>/<seq>`` one past the head: in the common case one request that
    finds nothing. A claim whose record exists is a commit; one without is a claim to take over.
    """
    if head is not None:
        seq, last = head.seq, head.batch_id
    elif writer in checkpoint.heads:
        seq, last = checkpoint.heads[writer]
    else:
        seq, last = -1, None
    claims = seq_claim(folder, writer)
    while True:
        name = f"{seq + 1:020d}"
        try:
            claimed = int(claims.read_bytes(name).decode())
        except FileNotFoundError:
            return seq, last
        if not folder.child(COMMITS).exists(commit_name(claimed)):
            return seq, last
        seq, last = seq + 1, claimed


def claim(folder: Location, writer: str, seq: int, batch_id: int) -> None:
    seq_claim(folder, writer).write_bytes(f"{seq:020d}", str(batch_id).encode())


def _walk_back(
    folder: Location, head: WriterHead, stop_seq: int, known: dict[int, Commit]
) -> tuple[list[Commit], list[int]]:
    """``head``'s writer's commits after ``stop_seq``, newest first, through ``previous``; and
    the seqs whose record is missing. Past a missing record the walk goes on through the
    writer's sequence claims (a GET each), so the commits before a gap are found too."""
    found: list[Commit] = []
    lost: list[int] = []
    batch_id: int | None = head.batch_id
    seq = head.seq
    claims = seq_claim(folder, head.writer)
    while seq > stop_seq:
        commit = None
        if batch_id is not None:
            commit = known.get(batch_id) or read_record(folder, batch_id)
        if commit is None or commit.seq != seq or commit.writer != head.writer:
            lost.append(seq)
            seq -= 1
            try:
                batch_id = (
                    int(claims.read_bytes(f"{seq:020d}").decode()) if seq > stop_seq else None
                )
            except FileNotFoundError:
                batch_id = None
            continue
        found.append(commit)
        batch_id, seq = commit.previous, seq - 1
    return found, lost


def fold(folder: Location, *, retire_upto: int | None = None) -> Checkpoint:
    """Write a new checkpoint: the last one plus every writer's commits since, up to its head
    (or up to a lost record: what is after a gap stays in the records, where readers find the
    gap). Old channels (no checkpoint) are folded from a listing of their records, once.
    ``retire_upto`` raises the retired watermark (retention)."""
    before = read_checkpoint(folder)
    heads, _ = read_heads(folder)
    new: list[Commit] = []
    folded = dict(before.heads) if before is not None else {}
    if before is None:
        commits_folder = folder.child(COMMITS)
        ids = [int(n.removesuffix(".json")) for n in commits_folder.list(".json")]
        for batch_id in ids:
            commit = read_record(folder, batch_id)
            if commit is None:
                continue
            new.append(commit)
            if commit.seq is not None:
                mine = folded.get(commit.writer)
                if mine is None or commit.seq > mine[0]:
                    folded[commit.writer] = [commit.seq, commit.batch_id]
        retired = [int(n.removesuffix(".retired")) for n in commits_folder.list(".retired")]
        watermark = max(retired, default=-1)
    else:
        watermark = before.retired_upto
        for writer, head in heads.items():
            stop = folded.get(writer, [-1, -1])[0]
            chain, lost = _walk_back(folder, head, stop, {})
            if chain and not lost:  # past a gap: left to the records, where readers find it
                new.extend(chain)
                folded[writer] = [chain[0].seq or 0, chain[0].batch_id]
    if retire_upto is not None:
        watermark = max(watermark, retire_upto)
    segments = list(before.segments) if before is not None else []
    if new:
        new.sort(key=lambda c: c.batch_id)
        segments.append(_write_segment(folder, _segment_table(new), 0))
        segments = _merged(folder, segments)
    segments = _without_retired_shards(folder, segments, watermark)
    checkpoint = Checkpoint(
        tuple(segments),
        folded,
        (before.commits if before is not None else 0) + len(new),
        watermark,
        interval=CHECKPOINT_INTERVAL,
        token=uuid.uuid4().hex,
    )
    folder.child(LOG).write_bytes(CHECKPOINT_FILE, checkpoint.to_json().encode())
    _sweep_segments(folder, (before, checkpoint))
    return checkpoint


def _sweep_segments(folder: Location, keep: Iterable[Checkpoint | None]) -> None:
    """Delete the segments none of ``keep`` names, once older than :data:`SEGMENT_GRACE_S`."""
    named = {
        s["name"] for checkpoint in keep if checkpoint is not None for s in checkpoint.segments
    }
    segments = folder.child(LOG, SEGMENTS)
    selector = pafs.FileSelector(segments.path, allow_not_found=True)
    cutoff = time.time() - SEGMENT_GRACE_S
    for info in folder.fs.get_file_info(selector):
        if info.type != pafs.FileType.File or info.base_name in named:
            continue
        if info.mtime is not None and info.mtime.timestamp() > cutoff:
            continue
        with contextlib.suppress(FileNotFoundError):
            folder.fs.delete_file(info.path)


def _without_retired_shards(
    folder: Location, segments: list[dict[str, Any]], retired_upto: int
) -> list[dict[str, Any]]:
    """``segments`` with each one that holds only commits up to ``retired_upto`` and still has
    their shard lists rewritten by :func:`_retired_table` (once: it is marked ``retired``). A
    segment that also holds later commits waits for a retention that covers it. The old file
    stays for a while, like a merged one (:data:`SEGMENT_GRACE_S`)."""
    if retired_upto < 0:
        return segments
    out = []
    for segment in segments:
        if segment.get("retired"):
            out.append(segment)
            continue
        table = None
        last = segment.get("last")
        if last is None:  # a segment written before segments said their last commit: once
            table = _read_segment(folder, segment["name"])
            last = int(np.max(table.column("batch_id").to_numpy())) if len(table) else -1
            segment = {**segment, "last": last}
        if last > retired_upto:
            out.append(segment)
            continue
        if table is None:
            table = _read_segment(folder, segment["name"])
        out.append(_write_segment(folder, _retired_table(table), segment["level"], retired=True))
    return out


def _merged(folder: Location, segments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Segments with every run of :data:`MERGE_SEGMENTS` of one level merged into one of the
    next (the old files stay for a while: a reader of the old checkpoint may need them; see
    :data:`SEGMENT_GRACE_S`)."""
    level = 0
    while True:
        same = [s for s in segments if s["level"] == level]
        if len(same) < MERGE_SEGMENTS:
            if not any(s["level"] > level for s in segments):
                return segments
            level += 1
            continue
        table = _read_segments(folder, [s["name"] for s in same])
        retired = all(s.get("retired") for s in same)
        merged = _write_segment(folder, table, level + 1, retired=retired)
        segments = [merged, *(s for s in segments if s["level"] != level)]
        segments.sort(key=lambda s: -s["level"])


# -- readers ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Links:
    """What the gap check needs of commits, as arrays (no record read): aligned with ids."""

    ids: np.ndarray
    writer: np.ndarray
    """A code per writer (equal codes: same writer)."""
    seq: np.ndarray
    """-1: unnumbered."""
    previous: np.ndarray
    """-1: none."""
    bad: np.ndarray
    """The record's total disagrees with its shards."""


class CommitLog:
    """What a channel holds, as a reader or writer sees it: the checkpoint's commits (arrays)
    and those after it (records, found from the writers' heads). Refresh to see new ones."""

    def __init__(self, folder: Location) -> None:
        self.folder = folder
        self.checkpoint: Checkpoint | None = None
        self.closed = False
        self._table = SEGMENT_SCHEMA.empty_table()
        self._ids = np.empty(0, dtype=np.int64)
        self._order = np.empty(0, dtype=np.int64)
        self._tail: dict[int, Commit] = {}
        self._tail_ids: list[int] = []
        self._seen: dict[str, tuple[int, int]] = {}
        """Each writer's latest commit in this view: (seq, batch id)."""
        self._codes: dict[str, int] = {}
        self._arrays: dict[str, np.ndarray] = {}
        self._loaded = False
        self._look_at = 0
        """Records held past which a refresh looks for a newer checkpoint (_reload_if_long)."""

    @property
    def legacy(self) -> bool:
        return self._loaded and self.checkpoint is None

    @property
    def records_held(self) -> int:
        """Commits this view holds as records read after its checkpoint (the rest are the
        checkpoint's arrays): what a following reader's memory grows by until it reloads."""
        return len(self._tail)

    # -- loading ------------------------------------------------------------------------------

    def load(self) -> None:
        """Read the checkpoint and its segments (or, for an old channel, the listing)."""
        self.checkpoint = read_checkpoint(self.folder)
        self._tail, self._tail_ids, self._seen = {}, [], {}
        if self.checkpoint is None:
            self._index(SEGMENT_SCHEMA.empty_table())
            self._loaded = True
            self._refresh_legacy()
            return
        self._index(_read_segments(self.folder, [s["name"] for s in self.checkpoint.segments]))
        self._seen = {w: (h[0], h[1]) for w, h in self.checkpoint.heads.items()}
        self._loaded = True
        self._look_at = self.checkpoint.interval
        self.refresh()

    def _index(self, table: pa.Table) -> None:
        ids = table.column("batch_id").to_numpy()
        order = np.argsort(ids, kind="stable")
        self._table, self._ids, self._order = table, ids[order], order
        # Writers by dictionary codes: a million names turned to Python strings took 0.3 s.
        encoded = table.column("writer").combine_chunks().dictionary_encode()
        codes = self._codes
        mapping = np.array(
            [codes.setdefault(w, len(codes)) for w in encoded.dictionary.to_pylist()] or [0],
            dtype=np.int64,
        )
        lookup = mapping[encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)]
        shards = table.column("shards").combine_chunks()
        offsets = shards.offsets.to_numpy() if len(table) else np.zeros(1, dtype=np.int32)
        flat = shards.flatten() if len(table) else None
        shard_rows = flat.field("rows").to_numpy() if flat is not None else np.empty(0, np.int64)
        rows = np.add.reduceat(shard_rows, offsets[:-1]) if len(shard_rows) else None
        sizes = np.diff(offsets)
        commit_rows = np.where(sizes > 0, rows, 0) if rows is not None else np.zeros(len(table))
        total = table.column("total_rows").to_numpy(zero_copy_only=False)
        self._arrays = {
            "writer": lookup[order],
            "seq": _ints(table.column("seq"))[order],
            "previous": _ints(table.column("previous"))[order],
            "rows": commit_rows.astype(np.int64)[order],
            "bad": (~np.isnan(total.astype(float)) & (total != commit_rows))[order],
            "offsets": offsets.astype(np.int64),
            "shard_bucket": flat.field("bucket").to_numpy()
            if flat is not None
            else np.empty(0, np.int64),
            "shard_rows": shard_rows,
        }

    def ensure(self) -> None:
        if not self._loaded:
            self.load()

    def refresh(self) -> bool:
        """Look for new commits: each writer's head, then the records after what this view
        holds. One LIST and one GET a writer when nothing changed. True if something came."""
        if not self._loaded:
            self.load()
            return True
        if self.checkpoint is None:
            return self._refresh_legacy()
        heads, self.closed = read_heads(self.folder)
        came = False
        for writer, head in heads.items():
            seen = self._seen.get(writer, (-1, -1))[0]
            if head.seq <= seen:
                continue
            chain, lost = _walk_back(self.folder, head, seen, self._tail)
            if lost and self._reload_if_folded():
                return self.refresh()
            for commit in chain:
                if commit.batch_id not in self._tail:
                    came = True
                self._add_tail(commit)
            # Below a missing record, look again next time: it may land late.
            top = min(lost) - 1 if lost else head.seq
            if top > seen:
                self._seen[writer] = (top, head.batch_id)
        if came:
            self._reload_if_long()
        return came

    def _reload_if_long(self) -> None:
        """A follower's view gains a record a micro-batch, for weeks: past a checkpoint
        interval of them, it starts again from the latest checkpoint, which holds them as
        arrays (flow bench soak: records held as objects cost ~40 KB each with 64 buckets, and
        their list a scan every poll). One GET, and a reload every interval's commits."""
        assert self.checkpoint is not None
        if len(self._tail) < self._look_at:
            return
        latest = read_checkpoint(self.folder)
        if latest is not None and latest.commits > self.checkpoint.commits:
            self.load()
        else:  # no fold since (a writer folds every interval): look again an interval on
            self._look_at = len(self._tail) + self.checkpoint.interval

    def _reload_if_folded(self) -> bool:
        """A record missing on a walk may have been retired since: a newer checkpoint holds it."""
        latest = read_checkpoint(self.folder)
        if latest is None or self.checkpoint is None or latest.token == self.checkpoint.token:
            return False
        self.load()
        return True

    def _add_tail(self, commit: Commit) -> None:
        if commit.batch_id in self._tail:
            return
        self._tail[commit.batch_id] = commit
        bisect.insort(self._tail_ids, commit.batch_id)
        self._codes.setdefault(commit.writer, len(self._codes))

    def _refresh_legacy(self) -> bool:
        # A writer of this version folds the channel into its first checkpoint when it first
        # commits (a new channel, or an old one upgraded): from then on the heads say what came,
        # and listing commits/ every poll would grow with the channel (flow bench soak found a
        # follower started before the first commit listing for its whole life).
        if read_checkpoint(self.folder) is not None:
            self.load()
            return True
        heads, _ = read_heads(self.folder)  # before listing: a head never names one in progress
        del heads
        self.closed = self.folder.exists("_closed")
        came = False
        for name in self.folder.child(COMMITS).list(".json"):
            batch_id = int(name.removesuffix(".json"))
            if batch_id not in self._tail:
                commit = read_record(self.folder, batch_id)
                if commit is not None:
                    self._add_tail(commit)
                    came = True
        return came

    # -- questions ----------------------------------------------------------------------------

    def ids(self, after: int = -1, upto: int | None = None) -> list[int]:
        """Batch ids of the commits in this view after ``after`` (up to ``upto``), in order."""
        self.ensure()
        start = int(np.searchsorted(self._ids, after, side="right"))
        stop = len(self._ids) if upto is None else int(np.searchsorted(self._ids, upto, "right"))
        held = self._ids[start:stop]
        # Sorted: the records after ``after`` are found without a scan (every poll asks).
        first = bisect.bisect_right(self._tail_ids, after)
        last = len(self._tail_ids) if upto is None else bisect.bisect_right(self._tail_ids, upto)
        tail = self._tail_ids[first:last]
        if not tail:
            return [int(b) for b in held.tolist()]
        return sorted([*held.tolist(), *tail])

    def _row(self, batch_id: int) -> int | None:
        at = int(np.searchsorted(self._ids, batch_id))
        return at if at < len(self._ids) and self._ids[at] == batch_id else None

    def has(self, batch_id: int) -> bool:
        self.ensure()
        return batch_id in self._tail or self._row(batch_id) is not None

    def folded(self, batch_id: int) -> bool:
        """Whether the checkpoint holds this commit (not only a record after it)."""
        self.ensure()
        return self._row(batch_id) is not None

    def commit(self, batch_id: int) -> Commit | None:
        self.ensure()
        found = self._tail.get(batch_id)
        if found is not None:
            return found
        at = self._row(batch_id)
        return None if at is None else _commit_of(self._table, int(self._order[at]))

    def retired(self, batch_id: int) -> bool:
        self.ensure()
        return self.checkpoint is not None and batch_id <= self.checkpoint.retired_upto

    def rows(self, ids: Sequence[int], buckets: frozenset[int] | None) -> int:
        """Rows of the commits ``ids`` (of ``buckets`` only, if given), without a record read."""
        self.ensure()
        wanted = np.asarray(ids, dtype=np.int64)
        at = np.searchsorted(self._ids, wanted)
        at = np.minimum(at, max(len(self._ids) - 1, 0))
        held = (self._ids[at] == wanted) if len(self._ids) else np.zeros(len(wanted), bool)
        total = 0
        if held.all() and buckets is None and len(wanted) == len(self._ids):
            total = int(self._arrays["rows"].sum())  # the whole log: no lookup
        elif held.any():
            rows = self._arrays["rows"]
            if buckets is None:
                total += int(rows[at[held]].sum())
            else:
                total += self._bucket_rows(at[held], buckets)
        for batch_id in wanted[~held].tolist():
            commit = self._tail[batch_id]
            total += sum(s.rows for s in commit.shards if buckets is None or s.bucket in buckets)
        return total

    def _bucket_rows(self, sorted_rows: np.ndarray, buckets: frozenset[int]) -> int:
        arrays = self._arrays
        offsets = arrays["offsets"]
        chosen = np.isin(arrays["shard_bucket"], list(buckets))
        per_shard = np.where(chosen, arrays["shard_rows"], 0)
        cumulative = np.concatenate([[0], np.cumsum(per_shard)])
        table_rows = self._order[sorted_rows]
        return int((cumulative[offsets[table_rows + 1]] - cumulative[offsets[table_rows]]).sum())

    def links(self, ids: Sequence[int]) -> Links:
        """Writer, seq, previous and damage of each of ``ids`` (held in this view)."""
        self.ensure()
        wanted = np.asarray(ids, dtype=np.int64)
        n = len(wanted)
        writer = np.zeros(n, np.int64)
        seq = np.full(n, -1, np.int64)
        previous = np.full(n, -1, np.int64)
        bad = np.zeros(n, bool)
        if len(self._ids) and n:
            at = np.minimum(np.searchsorted(self._ids, wanted), len(self._ids) - 1)
            held = self._ids[at] == wanted
            for name, out in (("writer", writer), ("seq", seq), ("previous", previous)):
                out[held] = self._arrays[name][at[held]]
            bad[held] = self._arrays["bad"][at[held]]
        else:
            held = np.zeros(n, bool)
        for i in np.flatnonzero(~held).tolist():
            commit = self._tail[int(wanted[i])]
            writer[i] = self._codes[commit.writer]
            seq[i] = -1 if commit.seq is None else commit.seq
            previous[i] = -1 if commit.previous is None else commit.previous
            bad[i] = commit.disagreement() is not None
        return Links(wanted, writer, seq, previous, bad)

    def codes(self) -> dict[str, int]:
        """The code of each writer in :meth:`links`."""
        return dict(self._codes)

    def unconsumed_bytes(self, done: int) -> int:
        """Bytes of commits after ``done`` not retired."""
        self.ensure()
        floor = max(done, self.checkpoint.retired_upto if self.checkpoint else -1)
        return sum(c.bytes for c in self._commits_after(floor))

    def _commits_after(self, after: int) -> Iterable[Commit]:
        for batch_id in self.ids(after):
            commit = self.commit(batch_id)
            if commit is not None:
                yield commit


def _ints(column: pa.ChunkedArray) -> np.ndarray:
    return np.asarray(column.fill_null(-1).to_numpy(), dtype=np.int64)
