"""Every pairing of the stack, exercised on the real services through one Spark session."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from flow.config import StackConfig
from flow.stack.iceberg import open_catalog
from flow.stack.kafka import ensure_topics, producer
from spark_jobs.sources import read_kafka

pytestmark = pytest.mark.integration


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def test_a_table_pyiceberg_writes_is_read_by_spark(
    spark: SparkSession, running_stack: StackConfig
) -> None:
    catalog = open_catalog(running_stack.catalog)
    catalog.create_namespace_if_not_exists("tests")
    name = _name("users")
    schema = pa.schema(
        [
            pa.field("user_id", pa.int64(), nullable=False),
            pa.field("country", pa.string()),
            pa.field("score", pa.float64()),
        ]
    )
    table = catalog.create_table(f"tests.{name}", schema=schema)
    table.append(
        pa.table(
            {"user_id": [1, 2, 3], "country": ["fr", "de", None], "score": [0.5, 1.5, 2.5]},
            schema=schema,
        )
    )
    table.append(pa.table({"user_id": [4], "country": ["us"], "score": [3.5]}, schema=schema))

    df = spark.table(f"{running_stack.catalog.name}.tests.{name}")
    assert df.count() == 4
    assert [(f.name, f.dataType.simpleString(), f.nullable) for f in df.schema.fields] == [
        ("user_id", "bigint", False),
        ("country", "string", True),
        ("score", "double", True),
    ]
    assert sorted(r.user_id for r in df.collect()) == [1, 2, 3, 4]
    # Both snapshots pyiceberg committed are visible to Spark's metadata tables.
    snapshots = spark.table(f"{running_stack.catalog.name}.tests.{name}.snapshots").count()
    assert snapshots == 2


def test_a_table_spark_writes_is_read_by_pyiceberg(
    spark: SparkSession, running_stack: StackConfig
) -> None:
    name = _name("items")
    full = f"{running_stack.catalog.name}.tests.{name}"
    spark.sql("CREATE NAMESPACE IF NOT EXISTS " + f"{running_stack.catalog.name}.tests")
    spark.sql(
        f"CREATE TABLE {full} (item_id BIGINT NOT NULL, price DOUBLE, tags ARRAY<STRING>) "
        "USING iceberg"
    )
    spark.sql(f"INSERT INTO {full} VALUES (1, 9.5, array('a')), (2, NULL, array()), (3, 1.0, NULL)")

    table = open_catalog(running_stack.catalog).load_table(f"tests.{name}")
    rows = table.scan().to_arrow()
    assert rows.num_rows == 3
    assert [(f.name, str(f.field_type), f.required) for f in table.schema().fields] == [
        ("item_id", "long", True),
        ("price", "double", False),
        ("tags", "list<string>", False),
    ]
    assert sorted(rows.column("item_id").to_pylist()) == [1, 2, 3]


def test_delta_merge_works_beside_the_iceberg_extension(
    spark: SparkSession, running_stack: StackConfig
) -> None:
    extensions = spark.conf.get("spark.sql.extensions") or ""
    assert "IcebergSparkSessionExtensions" in extensions
    assert "DeltaSparkSessionExtension" in extensions
    path = str(running_stack.lake / _name("totals"))

    spark.createDataFrame([(1, 10), (2, 20), (3, 30)], "id long, total long").write.format(
        "delta"
    ).save(path)
    updates = spark.createDataFrame([(2, 200), (4, 400)], "id long, total long")
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(updates.alias("u"), "t.id = u.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    spark.sql(
        f"MERGE INTO delta.`{path}` t USING (SELECT 3 AS id) d ON t.id = d.id "
        "WHEN MATCHED THEN DELETE"
    )

    back = {r.id: r.total for r in spark.read.format("delta").load(path).collect()}
    assert back == {1: 10, 2: 200, 4: 400}
    history = DeltaTable.forPath(spark, path).history().select("operation").collect()
    assert [h.operation for h in history] == ["MERGE", "MERGE", "WRITE"]


def _produce(stack: StackConfig, topic: str, ids: range) -> None:
    out = producer(stack.kafka)
    for i in ids:
        out.produce(topic, key=str(i), value=json.dumps({"id": i, "v": i * 1.5}))
    assert out.flush(30) == 0


def test_kafka_records_reach_a_checkpointed_structured_stream(
    spark: SparkSession, running_stack: StackConfig, tmp_path: Path
) -> None:
    topic = _name("events")
    ensure_topics(running_stack.kafka, [topic], partitions=3)
    _produce(running_stack, topic, range(120))
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def drain() -> None:
        raw = read_kafka(spark, running_stack.kafka, [topic])
        parsed = raw.selectExpr(
            "CAST(get_json_object(CAST(value AS STRING), '$.id') AS BIGINT) AS id",
            "partition",
            "offset",
        )
        query = (
            parsed.writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        assert query.exception() is None

    drain()
    assert sorted(r.id for r in spark.read.parquet(str(out)).collect()) == list(range(120))

    # A restart from the same checkpoint reads only what arrived since: no loss, no repeat.
    _produce(running_stack, topic, range(120, 150))
    drain()
    ids = [r.id for r in spark.read.parquet(str(out)).collect()]
    assert sorted(ids) == list(range(150))
