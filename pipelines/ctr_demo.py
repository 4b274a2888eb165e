"""CTR end to end in one Spark job: the backfill over Iceberg history, then the live stream.

What ``flow demo`` runs (with a trainer following both channels). On its own:

    flow generate history && flow generate stream --count 20000
    flow run --train "--namespace ctr --channel backfill --channel live" pipelines/ctr_demo.py

The backfill fits the feature state and writes channel ``backfill`` (closed when done, so a
trainer reading it first moves on to ``live``); the live stage then works off the Kafka backlog
in micro-batches of at most ``max_records_per_batch`` impressions, each a commit on ``live``.
"""

from __future__ import annotations

from typing import Literal

from flow.pipeline import Pipeline, run_main
from pipelines.ctr import NAMESPACE
from pipelines.ctr_backfill import ctr_backfill
from pipelines.ctr_streaming import ctr_streaming


def ctr_demo(
    namespace: str = NAMESPACE,
    max_records_per_batch: int = 5_000,
    trigger: str = "2 seconds",
    label_strategy: Literal["window", "immediate"] = "immediate",
) -> Pipeline:
    """The two CTR pipelines as one: the backfill's stage, then the live one (a micro-batch every
    ``trigger``, each impression emitted at once and again when its click comes: fresh rows,
    whose bias the trainer corrects). Both call their events "impressions" and their labels
    "clicks", so the history's are renamed; the dimension tables they share are one source
    each."""
    history = ctr_backfill(namespace).renamed(
        sources={"impressions": "history", "clicks": "history_clicks"}
    )
    live = ctr_streaming(
        namespace,
        max_records_per_batch=max_records_per_batch,
        trigger=trigger,
        label_strategy=label_strategy,
    )
    return Pipeline.combine("ctr_demo", history, live)


if __name__ == "__main__":
    import argparse

    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--namespace", default=NAMESPACE)
    own.add_argument("--max-records-per-batch", type=int, default=5_000)
    own.add_argument("--trigger", default="2 seconds")
    own.add_argument("--label-strategy", choices=("window", "immediate"), default="immediate")
    args, rest = own.parse_known_args()
    demo = ctr_demo(args.namespace, args.max_records_per_batch, args.trigger, args.label_strategy)
    run_main(demo, argv=rest)
