"""The trainer side of ``flow bench soak``: a following ChannelReader in a process of its own.

    python benchmarks/_soak_follower.py WHERE CHANNEL OUT [--group soak]

Waits for the channel to exist, then follows it until its producer closes it, recording the
position for retention under ``--group`` as a trainer does. Writes OUT (JSON) at the end: the
rows read; how often each impression id came as a negative and as a positive, summed up (the
ids are ``<prefix>-<9 digits>``, as the real-time generator makes them: counted by number, a
million ids in a few MB); and every look for new commits: when (wall clock), how long it took,
its storage requests, whether it was idle (found no new commit: it read the writers' heads
only) and this process's RSS.

Its own process, not a thread of the driver: its polls are timed without the driver's GIL in
them, and the driver's memory does not include the reader's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import fs as pafs

from flow.handoff import Channel, ChannelReader, ReadOptions
from flow.handoff.format import WRITERS
from flow.storage import CountingHandler, Location, location

ID_DIGITS = 9
"""The real-time generator's impression ids end in this many digits (flow.workflows.streaming)."""


def rss_bytes(pid: int | str = "self") -> int | None:
    """A process's resident set size from /proc (Linux); None where there is no /proc."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


class IdCounts:
    """How many times each impression number came, as a negative and as a positive."""

    def __init__(self) -> None:
        self.negatives = np.zeros(0, dtype=np.uint16)
        self.positives = np.zeros(0, dtype=np.uint16)
        self.prefixes: set[str] = set()

    def add(self, batch: pa.RecordBatch) -> None:
        ids = batch.column("impression_id")
        numbers = pc.cast(pc.utf8_slice_codeunits(ids, -ID_DIGITS), pa.int64()).to_numpy()
        self.prefixes.update(pc.unique(pc.utf8_slice_codeunits(ids, 0, -ID_DIGITS - 1)).to_pylist())
        positive = pc.greater(batch.column("label"), 0.5).to_numpy(zero_copy_only=False)
        top = int(numbers.max(initial=-1)) + 1
        if top > len(self.negatives):
            size = max(top, 2 * len(self.negatives))
            self.negatives = np.concatenate(
                [self.negatives, np.zeros(size - len(self.negatives), np.uint16)]
            )
            self.positives = np.concatenate(
                [self.positives, np.zeros(size - len(self.positives), np.uint16)]
            )
        np.add.at(self.negatives, numbers[~positive], 1)
        np.add.at(self.positives, numbers[positive], 1)

    def summary(self) -> dict[str, object]:
        """How many ids came how many times (``{"1": n}`` when each came once), the largest
        number, and the positives whose impression never came as a negative."""

        def histogram(counts: np.ndarray) -> dict[str, int]:
            values, n = np.unique(counts[counts > 0], return_counts=True)
            return {str(v): int(k) for v, k in zip(values.tolist(), n.tolist(), strict=True)}

        seen = np.flatnonzero(self.negatives | self.positives)
        return {
            "negatives": histogram(self.negatives),
            "positives": histogram(self.positives),
            "largest_number": int(seen.max()) if len(seen) else -1,
            "positives_without_negative": int(((self.positives > 0) & (self.negatives == 0)).sum()),
        }


class Looks(CountingHandler):
    """Counts requests, and notes whether any read touched more than the writers' heads: a
    look that found no new commit reads ``writers/`` only (one LIST, a GET a writer)."""

    def __init__(self, inner: pafs.FileSystem) -> None:
        super().__init__(inner)
        self.beyond_heads = False

    def _touch(self, path: str) -> None:
        if f"/{WRITERS}/" not in f"{path}/":
            self.beyond_heads = True

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        for path in paths:
            self._touch(path)
        return super().get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        self._touch(selector.base_dir)
        return super().get_file_info_selector(selector)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        self._touch(path)
        return super().open_input_stream(path)

    def open_input_file(self, path: str) -> pa.NativeFile:
        self._touch(path)
        return super().open_input_file(path)


def follow(where: str, channel: str, group: str, out: Path) -> None:
    while not Channel(where, channel).exists():  # the live stage makes it at its first batch
        time.sleep(0.2)
    folder = location(where)
    looks = Looks(folder.fs)
    counted = Location(pafs.PyFileSystem(looks), folder.path, folder.uri, folder.s3)
    polls: list[list[float]] = []
    rows = 0
    woke, calls_at = time.perf_counter(), 0

    def sleep(seconds: float) -> None:
        # A look is the reader's work between two pauses: timed from waking to pausing again,
        # so this bookkeeping is outside it.
        nonlocal woke, calls_at
        took = time.perf_counter() - woke
        idle = 0.0 if looks.beyond_heads else 1.0
        polls.append([time.time(), took, looks.total() - calls_at, idle, rss_bytes() or 0])
        time.sleep(seconds)
        woke, calls_at, looks.beyond_heads = time.perf_counter(), looks.total(), False

    reader = ChannelReader(
        counted,
        channel,
        options=ReadOptions(batch_size=256, follow=True, consumer_group=group),
        sleep=sleep,
    )
    ids = IdCounts()
    for batch in reader:
        rows += batch.num_rows
        ids.add(batch)
    result = {
        "rows": rows,
        "prefixes": sorted(ids.prefixes),
        **ids.summary(),
        "polls": polls,
        "poll_fields": ["wall_time", "seconds", "requests", "idle", "rss_bytes"],
    }
    out.write_text(json.dumps(result))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("where", help="the handoff folder (URI or path) the channel is in")
    parser.add_argument("channel")
    parser.add_argument("out", type=Path, help="where the JSON result goes")
    parser.add_argument("--group", default="soak", help="consumer group (for retention)")
    args = parser.parse_args(argv)
    follow(args.where, args.channel, args.group, args.out)


if __name__ == "__main__":
    main()
