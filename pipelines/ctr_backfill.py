"""CTR backfill: impression and click history in Iceberg -> training rows; fits the features.

flow generate history                        # synthetic history, if there is none
flow run pipelines/ctr_backfill.py
spark-submit $(flow spark-args) pipelines/ctr_backfill.py
"""

from __future__ import annotations

from flow.pipeline import BackfillStage, IcebergSource, Pipeline, run_main
from pipelines.ctr import (
    CLICK_FIELDS,
    IMPRESSION_FIELDS,
    NAMESPACE,
    ctr_features,
    dimensions,
    enrichment,
    label_join,
)


def ctr_backfill(namespace: str = NAMESPACE) -> Pipeline:
    return Pipeline(
        name="ctr_backfill",
        namespace=namespace,
        sources={
            "impressions": IcebergSource(
                f"{namespace}.impressions_history", IMPRESSION_FIELDS, event_time="ts"
            ),
            "clicks": IcebergSource(f"{namespace}.clicks_history", CLICK_FIELDS, event_time="ts"),
            **dimensions(namespace),
        },
        stages=(
            BackfillStage(
                name="backfill",
                events="impressions",
                label=label_join(),
                enrich=enrichment(),
                features=ctr_features(),
                channel="backfill",
                fit=True,
            ),
        ),
    )


if __name__ == "__main__":
    run_main(ctr_backfill())
