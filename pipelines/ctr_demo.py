"""CTR end to end in one Spark job: the backfill over Iceberg history, then the live stream.

What ``flow demo`` runs (with a trainer following both channels). On its own:

    flow generate history && flow generate stream --count 20000
    flow run --train "--namespace ctr --channel backfill --channel live" pipelines/ctr_demo.py

The backfill fits the feature state and writes channel ``backfill`` (closed when done, so a
trainer reading it first moves on to ``live``); the live stage then works off the Kafka backlog
in micro-batches of at most ``max_records_per_batch`` impressions, each a commit on ``live``.
"""

from __future__ import annotations

from flow.engine import run_main
from flow.pipeline import BackfillStage, IcebergSource, KafkaSource, LabelJoin, LiveStage, Pipeline
from pipelines.ctr import (
    CLICK_FIELDS,
    IMPRESSION_FIELDS,
    NAMESPACE,
    ctr_features,
    dimensions,
    enrichment,
    label_join,
)


def ctr_demo(namespace: str = NAMESPACE, max_records_per_batch: int = 5_000) -> Pipeline:
    history_labels = LabelJoin("history_clicks", key="impression_id", window=label_join().window)
    return Pipeline(
        name="ctr_demo",
        namespace=namespace,
        sources={
            "history": IcebergSource(
                f"{namespace}.impressions_history", IMPRESSION_FIELDS, event_time="ts"
            ),
            "history_clicks": IcebergSource(
                f"{namespace}.clicks_history", CLICK_FIELDS, event_time="ts"
            ),
            "impressions": KafkaSource(
                f"{namespace}.impressions",
                IMPRESSION_FIELDS,
                event_time="ts",
                watermark="10 minutes",
                max_records_per_batch=max_records_per_batch,
            ),
            "clicks": KafkaSource(
                f"{namespace}.clicks", CLICK_FIELDS, event_time="ts", watermark="10 minutes"
            ),
            **dimensions(namespace),
        },
        stages=(
            BackfillStage(
                name="backfill",
                events="history",
                label=history_labels,
                enrich=enrichment(),
                features=ctr_features(),
                channel="backfill",
                fit=True,
            ),
            LiveStage(
                name="live",
                events="impressions",
                label=label_join(),
                enrich=enrichment(),
                features=ctr_features(),
                channel="live",
                trigger="2 seconds",
            ),
        ),
    )


if __name__ == "__main__":
    import argparse

    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--namespace", default=NAMESPACE)
    own.add_argument("--max-records-per-batch", type=int, default=5_000)
    args, rest = own.parse_known_args()
    run_main(ctr_demo(args.namespace, args.max_records_per_batch), argv=rest)
