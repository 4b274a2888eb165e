"""A live batch's dead letters and counts, kept as a file and appended while the next batch
runs: in order, once, and never lost between a run and the next."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest

from flow.storage import location
from spark_jobs.live.pending_ledger import PendingLedger


class _Ledger:
    """Stands in for the dead-letter table: the batches appended, in order."""

    def __init__(self, fail: set[int] | None = None) -> None:
        self.appended: list[tuple[int, list[str], dict[str, int]]] = []
        self.fail = fail or set()
        self.release = threading.Event()
        self.release.set()

    @property
    def last(self) -> int:
        return self.appended[-1][0] if self.appended else -1

    def append(self, batch_id: int, letters: pa.Table, counts: dict[str, int]) -> None:
        self.release.wait(5)
        if batch_id in self.fail:
            raise RuntimeError(f"the catalog refused batch {batch_id}")
        self.appended.append((batch_id, letters.column("reason").to_pylist(), counts))


def _letters(*reasons: str) -> pa.Table:
    return pa.table({"reason": pa.array(list(reasons), pa.string())})


def _pending(tmp_path: Path, ledger: _Ledger) -> PendingLedger:
    return PendingLedger(
        location(str(tmp_path / "pending")), ledger.append, lambda: ledger.last, "live"
    )


def test_batches_are_appended_in_order_each_after_the_one_before(tmp_path: Path) -> None:
    ledger = _Ledger()
    pending = _pending(tmp_path, ledger)
    ledger.release.clear()  # batch 0's append hangs until released
    pending.keep(0, _letters("invalid json"), {"flow.input.e": 3})
    pending.append_soon(0)
    pending.keep(1, _letters(), {"flow.input.e": 2})
    assert ledger.appended == []
    ledger.release.set()
    pending.append_soon(1)  # waits for batch 0 first
    pending.wait()
    assert ledger.appended == [
        (0, ["invalid json"], {"flow.input.e": 3}),
        (1, [], {"flow.input.e": 2}),
    ]
    assert location(str(tmp_path / "pending")).list() == []


def test_a_failed_append_is_raised_by_the_next_batch_and_its_file_kept(tmp_path: Path) -> None:
    ledger = _Ledger(fail={0})
    pending = _pending(tmp_path, ledger)
    pending.keep(0, _letters("late"), {"flow.late.e": 1})
    pending.append_soon(0)
    with pytest.raises(RuntimeError, match="refused batch 0"):
        pending.append_soon(1)
    assert location(str(tmp_path / "pending")).list() == ["00000000000000000000.arrow"]


def test_the_next_run_appends_what_the_last_one_kept_and_drops_what_the_ledger_has(
    tmp_path: Path,
) -> None:
    ledger = _Ledger()
    ledger.appended.append((3, [], {}))
    before = _pending(tmp_path, ledger)
    for batch in (3, 4, 5):  # a run that stopped after keeping them, before appending
        before.keep(batch, _letters(f"reason {batch}"), {"flow.input.e": batch})
    said: list[str] = []
    after = PendingLedger(
        location(str(tmp_path / "pending")), ledger.append, lambda: ledger.last, "live", said.append
    )
    assert after.recover() == 2
    assert [b for b, _, _ in ledger.appended] == [3, 4, 5]
    assert ledger.appended[-1] == (5, ["reason 5"], {"flow.input.e": 5})
    assert location(str(tmp_path / "pending")).list() == []
    assert "2 batch(es)" in said[0]
