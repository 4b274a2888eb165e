"""CTR streaming: Kafka impressions and clicks, enriched from Iceberg users and items.

Needs the feature state the backfill fitted (run pipelines/ctr_backfill.py first).

    flow generate stream --count 20000          # synthetic events, malformed ones included
    flow run pipelines/ctr_streaming.py          # process what has arrived, then stop
    flow run pipelines/ctr_streaming.py --continuous --duration 120
"""

from __future__ import annotations

from typing import Literal

from flow.pipeline import KafkaSource, LiveStage, Pipeline, run_main
from pipelines.ctr import (
    CLICK_FIELDS,
    IMPRESSION_FIELDS,
    NAMESPACE,
    ctr_features,
    dimensions,
    enrichment,
    label_join,
)


def ctr_streaming(
    namespace: str = NAMESPACE,
    max_records_per_batch: int | None = None,
    trigger: str = "10 seconds",
    label_strategy: Literal["window", "immediate"] = "window",
) -> Pipeline:
    """``max_records_per_batch`` caps impressions per micro-batch (a backlog is worked off in
    steps rather than one huge batch); ``trigger`` is the micro-batch interval of continuous
    runs; ``label_strategy`` says when an impression is emitted (LabelJoin.strategy)."""
    return Pipeline(
        name="ctr_streaming",
        namespace=namespace,
        sources={
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
            LiveStage(
                name="live",
                events="impressions",
                label=label_join(label_strategy),
                enrich=enrichment(),
                features=ctr_features(),
                channel="live",
                trigger=trigger,
            ),
        ),
    )


if __name__ == "__main__":
    run_main(ctr_streaming())
