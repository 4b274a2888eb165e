"""The stack smoke pipeline: Kafka, Iceberg, Delta and MLflow through Spark.

flow run pipelines/smoke.py                     # the local stack, brought up first
flow submit --master spark://host:7077 pipelines/smoke.py
spark-submit $(flow spark-args) pipelines/smoke.py --events 5000
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from flow.pipeline import run_main
from flow.pipeline.smoke import SmokeCheck


def smoke() -> SmokeCheck:
    """2,000 events for 50 users through every part of the stack."""
    return SmokeCheck()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, help="events to produce (default 2000)")
    parser.add_argument("--users", type=int, help="users in the dimension table (default 50)")
    cli = parser.parse_args()
    overrides = {k: v for k, v in vars(cli).items() if v is not None}
    run_main(replace(smoke(), **overrides))
