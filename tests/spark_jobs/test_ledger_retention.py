"""A ledger's snapshots expired by roll-ups of their counts (spark_jobs.sinks): totals exact
before, during and after an expiry, and the metadata bounded as batches go on (issue 43)."""

from __future__ import annotations

from collections import Counter

import pytest

from spark_jobs.sinks import ROLLUP, LedgerRetention, expirable, ledger_totals

WRITER = "ctr.live:a"


def _summary(batch: int, n: int, records: int = 1, writer: str = WRITER) -> dict[str, str]:
    return {
        "flow.writer": writer,
        "flow.batch": str(batch),
        "added-records": str(records),
        "flow.input.impressions": str(n),
    }


class _Table:
    """A writer's snapshots as BatchLedger makes them: a commit a batch, a roll-up in each
    ``every``-th, then the expiry that :func:`expirable` chooses."""

    def __init__(self, retention: LedgerRetention) -> None:
        self.retention = retention
        self.snapshots: dict[int, tuple[int, dict[str, str]]] = {}  # id -> (ms, summary)
        self.expired = 0

    def summaries(self) -> list[dict[str, str]]:
        return [s for _, s in self.snapshots.values()]

    def commit(self, batch: int, *, expire: bool = True) -> None:
        summary = _summary(batch, n=batch % 7, records=batch % 3)
        if batch % self.retention.every == 0:
            totals, upto = ledger_totals(self.summaries(), batch - 1)
            if upto >= 0:
                summary[f"{ROLLUP}batch"] = str(upto)
                summary |= {f"{ROLLUP}{k}": str(v) for k, v in totals.items()}
        self.snapshots[len(self.snapshots) + self.expired] = (batch * 1000, summary)
        if expire and f"{ROLLUP}batch" in summary:
            self.expire(now_ms=batch * 1000)

    def expire(self, now_ms: int) -> None:
        listed = [(i, at, s) for i, (at, s) in self.snapshots.items()]
        for snapshot_id in expirable(listed, self.retention, now_ms):
            del self.snapshots[snapshot_id]
            self.expired += 1


def _expected(upto: int) -> Counter[str]:
    return Counter(
        {
            "commits": upto + 1,
            "added-records": sum(b % 3 for b in range(upto + 1)),
            "flow.input.impressions": sum(b % 7 for b in range(upto + 1)),
        }
    )


def test_totals_stay_exact_and_the_snapshots_bounded_as_batches_go_on() -> None:
    retention = LedgerRetention(every=10, keep=10, min_age_s=5.0)  # 5 batches at 1 s
    table = _Table(retention)
    held = {}
    for batch in range(400):
        table.commit(batch)
        totals, last = ledger_totals(table.summaries())
        assert totals == _expected(batch), batch
        assert last == batch
        # What the run's report asks: up to the batch both sinks have (one behind, at most).
        assert ledger_totals(table.summaries(), batch - 1)[0] == _expected(batch - 1), batch
        held[batch] = len(table.snapshots)
    assert max(held[b] for b in range(200, 400)) <= retention.every + retention.keep + 1
    assert held[399] <= held[199]  # bounded: 400 batches keep no more than 200 did


def test_without_expiry_every_snapshot_stays() -> None:
    table = _Table(LedgerRetention(every=10, keep=10, min_age_s=0))
    for batch in range(200):
        table.commit(batch, expire=False)
    assert len(table.snapshots) == 200
    assert ledger_totals(table.summaries())[0] == _expected(199)  # roll-ups double nothing


def test_a_rolled_up_snapshot_is_kept_while_young_or_among_the_last_batches() -> None:
    retention = LedgerRetention(every=10, keep=3, min_age_s=60.0)
    table = _Table(retention)
    for batch in range(21):
        table.commit(batch, expire=False)
    listed = [(i, at, s) for i, (at, s) in table.snapshots.items()]
    # At batch 20's time (20 s): nothing is a minute old.
    assert expirable(listed, retention, now_ms=20_000) == []
    # Later: what the roll-up in batch 20 covers (0-19), less the last 3 batches (18-20).
    chosen = expirable(listed, retention, now_ms=10**9)
    assert sorted(int(table.snapshots[i][1]["flow.batch"]) for i in chosen) == list(range(18))


def test_other_writers_and_snapshots_without_a_roll_up_are_never_expired() -> None:
    retention = LedgerRetention(every=10, keep=1, min_age_s=0)
    mine = [(b, 0, _summary(b, 1)) for b in range(9)]
    assert expirable(mine, retention, now_ms=10**9) == []  # nothing rolled up yet
    # BatchLedger lists one writer's snapshots only (``flow.writer``); its roll-up is its own.
    other = [(100 + b, 0, _summary(b, 1, writer="other")) for b in range(5)]
    assert ledger_totals([s for _, _, s in other])[0]["commits"] == 5


def test_a_retention_names_the_field_to_change() -> None:
    with pytest.raises(ValueError, match="every"):
        LedgerRetention(every=0)
    with pytest.raises(ValueError, match="keep"):
        LedgerRetention(keep=0)
    with pytest.raises(ValueError, match="min_age_s"):
        LedgerRetention(min_age_s=-1)
