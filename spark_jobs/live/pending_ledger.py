"""A live batch's dead letters and counts, appended to the ledger while the next batch runs.

The dead-letter table's Iceberg append (a one-task Spark write and the commit: ~0.3 s on the
2-core machine) came after each micro-batch's job, with the cores idle. Here a batch keeps its
dead letters and counts as a file first (``<batch>.arrow`` in the checkpoint's
``flow-pending-ledger`` folder; the counts in the schema's metadata), written before the batch's
training commit, and the append runs in a thread of its own beside the next batch's job. The
next batch waits for it before it appends its own, so the ledger's batches stay in order.

Nothing is lost when a run stops or fails between the two: the file is there, and the next run
appends it (:meth:`PendingLedger.recover`) before its query starts. A file whose batch the
ledger already has is deleted.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping

import pyarrow as pa

from flow.storage import Location

__all__ = ["FOLDER", "Append", "PendingLedger"]

Append = Callable[[int, pa.Table, dict[str, int]], None]
"""Appends a batch's dead letters (Arrow) with its counts to the ledger."""

FOLDER = "flow-pending-ledger"
"""The pending batches' folder, in the query's checkpoint (a reset checkpoint drops them with the
writer id they were written under)."""
_COUNTS = b"flow.counts"
_SUFFIX = ".arrow"


class PendingLedger:
    """One stage's ledger appends, each made from its file while the next batch runs."""

    def __init__(
        self,
        folder: Location,
        append: Append,
        last: Callable[[], int],
        stage: str,
        progress: Callable[[str], None] = lambda _: None,
    ) -> None:
        """``last()``: the last batch the ledger has (-1: none)."""
        self.folder, self._append_to, self.last = folder, append, last
        self.stage, self.progress = stage, progress
        self._thread: threading.Thread | None = None
        self._failed: list[BaseException] = []

    def keep(self, batch_id: int, letters: pa.Table, counts: Mapping[str, int]) -> None:
        """Write ``batch_id``'s dead letters and counts (durable before its training commit)."""
        metadata = {_COUNTS: json.dumps({k: int(v) for k, v in counts.items()}).encode()}
        table = letters.replace_schema_metadata(metadata)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as out:
            out.write_table(table)
        self.folder.write_bytes(_name(batch_id), sink.getvalue())

    def append_soon(self, batch_id: int) -> None:
        """Append the kept ``batch_id`` in a thread; the previous append is waited for first."""
        self.wait()
        # A plain thread, not one that inherits the stream's job group: stopping the query
        # cancels that group's jobs, and the append must not be cut off with it.
        self._thread = threading.Thread(
            target=self._append_kept, args=(batch_id,), name="ledger-append", daemon=True
        )
        self._thread.start()

    def wait(self) -> None:
        """Until the append in flight is done; its error, if it failed (its file stays)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._failed:
            error = self._failed.pop()
            self._failed.clear()
            raise error

    def recover(self) -> int:
        """Append every kept batch the ledger does not have yet, in order, and delete the files
        of those it has; how many were appended."""
        self.wait()
        appended = 0
        for name in self.folder.list(_SUFFIX):
            batch_id = int(name.removesuffix(_SUFFIX))
            if batch_id > self.last():
                self._append(batch_id)
                appended += 1
            self.folder.delete(name)
        if appended:
            self.progress(
                f"{self.stage}: appended the dead letters and counts of {appended} batch(es) a "
                "previous run had committed to the channel only"
            )
        return appended

    def _append_kept(self, batch_id: int) -> None:
        try:
            self._append(batch_id)
            self.folder.delete(_name(batch_id))
        except BaseException as error:  # the next batch (or the end of the run) raises it
            self._failed.append(error)

    def _append(self, batch_id: int) -> None:
        with self.folder.reading(_name(batch_id)) as source:
            table = pa.ipc.open_file(source).read_all()
        counts = json.loads((table.schema.metadata or {}).get(_COUNTS, b"{}"))
        self._append_to(batch_id, table.replace_schema_metadata(None), counts)


def _name(batch_id: int) -> str:
    return f"{batch_id:020d}{_SUFFIX}"
