"""The stack smoke pipeline: Kafka, Iceberg, Delta and MLflow through Spark, counts reconciled.

Stages (each a nested MLflow run under one parent run):

1. ``iceberg-dimensions``: pyiceberg appends this run's users to ``<ns>.users``.
2. ``kafka-produce``: a Python producer writes this run's JSON events to the topic.
3. ``spark-stream``: Structured Streaming reads the topic (checkpointed, so only new offsets),
   parses the JSON, enriches each event from the Iceberg users table, appends to the Iceberg
   table ``<ns>.events_enriched``.
4. ``delta-merge``: a Spark batch MERGEs per-user totals of this run into a Delta table.
5. ``verify``: pyiceberg reads what Spark wrote; produced = enriched = merged, or the run fails.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from rich.markup import escape
from rich.table import Table

from flow.config import StackConfig
from flow.console import console as make_console
from flow.errors import ServiceError
from flow.pipeline.smoke import SmokeCheck
from flow.stack.iceberg import open_catalog
from flow.stack.kafka import ensure_topics, producer
from flow.storage import location
from flow.tracking import MlflowTracker
from spark_jobs.session import get_session
from spark_jobs.sources import read_kafka

__all__ = ["SmokeReport", "run_smoke"]

console = make_console()

EVENT_SCHEMA = T.StructType(
    [
        T.StructField("run_tag", T.StringType()),
        T.StructField("event_id", T.LongType()),
        T.StructField("user_id", T.LongType()),
        T.StructField("amount", T.DoubleType()),
        T.StructField("ts", T.TimestampType()),
    ]
)
USERS_SCHEMA = pa.schema(
    [("run_tag", pa.string()), ("user_id", pa.int64()), ("segment", pa.string())]
)
SEGMENTS = ("new", "casual", "loyal")


@dataclass
class SmokeReport:
    """What one smoke run produced at each stage."""

    run_tag: str
    counts: dict[str, int] = field(default_factory=dict)
    mlflow_url: str = ""

    @property
    def reconciled(self) -> bool:
        c = self.counts
        wanted = c.get("kafka.produced")
        return (
            wanted is not None
            and wanted == c.get("spark.enriched_rows") == c.get("delta.merged_events")
            and c.get("spark.unmatched_users") == 0
            and c.get("pyiceberg.users_rows") == c.get("iceberg.users_appended")
        )


def _say(message: str) -> None:
    console.print(f"[bold cyan]smoke[/] {escape(message)}", highlight=False)


def _produce(spec: SmokeCheck, stack: StackConfig, run_tag: str) -> int:
    ensure_topics(stack.kafka, [spec.topic], partitions=2)
    rng = random.Random(run_tag)
    start = datetime.now(UTC)
    failures: list[str] = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    out = producer(stack.kafka)
    for event_id in range(spec.events):
        event = {
            "run_tag": run_tag,
            "event_id": event_id,
            "user_id": rng.randrange(spec.users),
            "amount": round(rng.expovariate(1 / 20), 2),
            "ts": (start + timedelta(milliseconds=event_id)).isoformat(),
        }
        out.produce(
            spec.topic, key=str(event["user_id"]), value=json.dumps(event), on_delivery=delivered
        )
        out.poll(0)
    remaining = out.flush(60)
    if remaining or failures:
        raise ServiceError(
            f"Kafka did not acknowledge {remaining + len(failures)} of {spec.events} events "
            f"({failures[:3]}); check `flow services status`"
        )
    return spec.events


def _stream(
    spark: SparkSession, spec: SmokeCheck, stack: StackConfig
) -> tuple[int, dict[str, object]]:
    cat, ns = stack.catalog.name, spec.namespace
    spark.sql(
        f"""CREATE TABLE IF NOT EXISTS {cat}.{ns}.events_enriched (
              run_tag STRING, event_id BIGINT, user_id BIGINT, amount DOUBLE, ts TIMESTAMP,
              segment STRING, kafka_partition INT, kafka_offset BIGINT)
            USING iceberg PARTITIONED BY (run_tag)"""
    )
    raw = read_kafka(spark, stack.kafka, [spec.topic])
    events = raw.select(
        F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
    ).select("e.*", "kafka_partition", "kafka_offset")
    # A stream-static join: Iceberg re-reads the table's current snapshot every micro-batch.
    users = spark.table(f"{cat}.{ns}.users").select("run_tag", "user_id", "segment")
    enriched = events.join(users, ["run_tag", "user_id"], "left").select(
        "run_tag",
        "event_id",
        "user_id",
        "amount",
        "ts",
        "segment",
        "kafka_partition",
        "kafka_offset",
    )
    query = (
        enriched.writeStream.format("iceberg")
        .outputMode("append")
        .option(
            "checkpointLocation",
            location(stack.checkpoints, stack.s3).child("smoke", "events_enriched").hadoop_uri,
        )
        .trigger(availableNow=True)
        .toTable(f"{cat}.{ns}.events_enriched")
    )
    query.awaitTermination()
    # Parse each progress's JSON: pyspark 4 hands nested offsets over as Python reprs.
    progress = [json.loads(p.json) for p in query.recentProgress]
    rows = sum(int(p["numInputRows"]) for p in progress)
    offsets: dict[str, object] = progress[-1]["sources"][0]["endOffset"] if progress else {}
    return rows, offsets


def _merge_totals(spark: SparkSession, spec: SmokeCheck, stack: StackConfig, run_tag: str) -> None:
    from delta.tables import DeltaTable

    table = f"{stack.catalog.name}.{spec.namespace}.events_enriched"
    totals = (
        spark.table(table)
        .where(F.col("run_tag") == run_tag)
        .groupBy("run_tag", "user_id", "segment")
        .agg(F.count("*").alias("events"), F.round(F.sum("amount"), 2).alias("amount"))
    )
    path = str(stack.lake / spec.delta_table)
    if not DeltaTable.isDeltaTable(spark, path):
        totals.limit(0).write.format("delta").save(path)
    # Keyed on (run_tag, user_id) and setting (not adding) values: a rerun converges.
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(totals.alias("s"), "t.run_tag = s.run_tag AND t.user_id = s.user_id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )


def run_smoke(spec: SmokeCheck, stack: StackConfig) -> SmokeReport:
    """Run the smoke pipeline once and report its counts; ``reconciled`` says if they agree."""
    run_tag = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
    report = SmokeReport(run_tag)
    counts = report.counts
    tracker = MlflowTracker(stack.mlflow.tracking_uri, spec.experiment)
    params = {f"smoke.{k}": v for k, v in spec.__dict__.items()}
    with tracker.pipeline_run("smoke", params=params, tags={"flow.run_tag": run_tag}) as parent:
        _say(f"run {run_tag}: tracking in {stack.mlflow.tracking_uri}")
        catalog = open_catalog(stack.catalog)

        with tracker.stage("iceberg-dimensions") as stage:
            catalog.create_namespace_if_not_exists(spec.namespace)
            users = catalog.create_table_if_not_exists(
                f"{spec.namespace}.users", schema=USERS_SCHEMA
            )
            users.append(
                pa.table(
                    {
                        "run_tag": [run_tag] * spec.users,
                        "user_id": list(range(spec.users)),
                        "segment": [SEGMENTS[i % len(SEGMENTS)] for i in range(spec.users)],
                    },
                    schema=USERS_SCHEMA,
                )
            )
            snapshot = users.current_snapshot()
            counts["iceberg.users_appended"] = spec.users
            stage.log_metrics({"rows_out": spec.users})
            stage.set_tags(
                {"iceberg.users.snapshot_id": str(snapshot.snapshot_id if snapshot else "")}
            )
            _say(f"pyiceberg appended {spec.users} users to {spec.namespace}.users")

        with tracker.stage("kafka-produce") as stage:
            started = time.monotonic()
            counts["kafka.produced"] = _produce(spec, stack, run_tag)
            rate = spec.events / max(time.monotonic() - started, 1e-9)
            stage.log_metrics({"rows_out": spec.events, "rows_per_s": rate})
            _say(f"produced {spec.events} events to {spec.topic} ({rate:,.0f}/s)")

        spark = get_session(stack, app_name="primus-flow-smoke")
        with tracker.stage("spark-stream") as stage:
            rows, offsets = _stream(spark, spec, stack)
            table = f"{stack.catalog.name}.{spec.namespace}.events_enriched"
            mine = spark.table(table).where(F.col("run_tag") == run_tag)
            counts["spark.stream_input_rows"] = rows
            counts["spark.enriched_rows"] = mine.count()
            counts["spark.unmatched_users"] = mine.where(F.col("segment").isNull()).count()
            stage.log_metrics({"rows_in": rows, "rows_out": counts["spark.enriched_rows"]})
            stage.set_tags({"kafka.end_offsets": json.dumps(offsets)})
            _say(f"streamed {rows} new Kafka records into Iceberg {table}")

        with tracker.stage("delta-merge") as stage:
            _merge_totals(spark, spec, stack, run_tag)
            merged = (
                spark.read.format("delta")
                .load(str(stack.lake / spec.delta_table))
                .where(F.col("run_tag") == run_tag)
                .agg(F.coalesce(F.sum("events"), F.lit(0)).alias("n"))
                .first()
            )
            counts["delta.merged_events"] = int(merged["n"]) if merged else 0
            stage.log_metrics({"rows_out": counts["delta.merged_events"]})
            _say(f"merged per-user totals into Delta {stack.lake / spec.delta_table}")

        with tracker.stage("verify") as stage:
            users_back = catalog.load_table(f"{spec.namespace}.users")
            counts["pyiceberg.users_rows"] = len(
                users_back.scan(row_filter=f"run_tag == '{run_tag}'").to_arrow()
            )
            enriched_back = catalog.load_table(f"{spec.namespace}.events_enriched")
            counts["pyiceberg.enriched_rows"] = len(
                enriched_back.scan(row_filter=f"run_tag == '{run_tag}'").to_arrow()
            )
            stage.log_metrics({k: float(v) for k, v in counts.items()})
            stage.log_metrics({"reconciled": float(report.reconciled)})
        parent.log_metrics({"reconciled": float(report.reconciled)})
        parent.log_dict(counts, "counts.json")

    report.mlflow_url = tracker.runs_url(parent.run_id)
    _print(report)
    return report


def _print(report: SmokeReport) -> None:
    table = Table(title=f"smoke run {report.run_tag}", show_header=True, header_style="bold")
    table.add_column("count")
    table.add_column("value", justify="right")
    for key, value in report.counts.items():
        table.add_row(key, f"{value:,}")
    console.print(table)
    verdict = (
        "[green]counts reconcile[/]" if report.reconciled else "[red]counts do NOT reconcile[/]"
    )
    console.print(f"{verdict}; MLflow: {escape(report.mlflow_url)}", highlight=False)
