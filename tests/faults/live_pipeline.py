"""The live stage the fault suite runs: impressions labelled by clicks, nothing to fit and no
dimension tables, so it runs on Kafka alone, without a backfill first.

    flow run tests/faults/live_pipeline.py --namespace NS --continuous [--strategy immediate]

Small micro-batches (``--per-batch``) so that a run is many commits, and a kill can land
anywhere among them.
"""

from __future__ import annotations

import argparse
from typing import Literal

from flow.pipeline import (
    FeatureSpec,
    Field,
    Hashed,
    KafkaSource,
    LabelJoin,
    LiveStage,
    Pipeline,
    run_main,
)

IMPRESSIONS = (
    Field("id", "string", required=True),
    Field("user_id", "long", required=True),
    Field("ts", "timestamp", required=True),
    Field("position", "int", min=1, max=50),
    Field("device", "string", allowed=("ios", "android", "web")),
)
CLICKS = (Field("id", "string", required=True), Field("ts", "timestamp", required=True))
WATERMARK = "1 minute"
WINDOW = "10 minutes"


def faults_pipeline(
    namespace: str,
    per_batch: int = 50,
    trigger: str = "2 seconds",
    strategy: Literal["window", "immediate"] = "window",
) -> Pipeline:
    sources = {
        "impressions": KafkaSource(
            f"{namespace}.impressions",
            IMPRESSIONS,
            event_time="ts",
            watermark=WATERMARK,
            max_payload_bytes=2048,
            max_records_per_batch=per_batch,
        ),
        "clicks": KafkaSource(f"{namespace}.clicks", CLICKS, event_time="ts", watermark=WATERMARK),
    }
    features = FeatureSpec(
        "faults",
        (Hashed("user_id", buckets=100), Hashed("device", buckets=8)),
        passthrough=("id",),
    )
    stage = LiveStage(
        "live",
        events="impressions",
        label=LabelJoin("clicks", key="id", window=WINDOW, strategy=strategy),
        features=features,
        channel="live",
        trigger=trigger,
    )
    return Pipeline("faults", namespace, sources, (stage,))


if __name__ == "__main__":
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--namespace", required=True)
    own.add_argument("--per-batch", type=int, default=50)
    own.add_argument("--strategy", choices=("window", "immediate"), default="window")
    args, rest = own.parse_known_args()
    run_main(faults_pipeline(args.namespace, args.per_batch, strategy=args.strategy), argv=rest)
