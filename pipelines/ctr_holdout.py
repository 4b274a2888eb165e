"""CTR backfill with the last day held out: training rows before it, evaluation rows after.

flow generate history                        # synthetic history up to now, if there is none
flow run pipelines/ctr_holdout.py
python -m trainers train --namespace ctr --channel backfill --eval-channel holdout

Stage ``backfill`` fits the features on the impressions before the split and writes channel
``backfill``; stage ``backfill_holdout`` writes those from the split on to channel ``holdout``
with the state ``backfill`` fitted in the same run (flow.pipeline.splits).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from flow.pipeline import Pipeline, run_main
from pipelines.ctr import NAMESPACE
from pipelines.ctr_backfill import ctr_backfill


def ctr_holdout(namespace: str = NAMESPACE, after: datetime | None = None) -> Pipeline:
    """``after`` defaults to the start of the hour a day ago: the history ``flow generate
    history`` writes ends now."""
    split = after or (datetime.now(UTC) - timedelta(days=1)).replace(
        minute=0, second=0, microsecond=0
    )
    return ctr_backfill(namespace).holdout("backfill", after=split)


if __name__ == "__main__":
    run_main(ctr_holdout())
