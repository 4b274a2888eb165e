"""Mechanisms of the live stage's speed and counts that a refactor could undo without any other
test failing: the settings its query starts with, the values its plans keep out of generated
code, the parse run once a record, the dead letters kept before the training commit
(spark_jobs/live/README.md lists every mechanism, with the tests that guard the others)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal, cast

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.pipeline import FeatureSpec, Vocabulary
from flow.pipeline.features import MAX_VOCABULARY
from flow.pipeline.model import LiveStage
from flow.pipeline.run import RunOptions
from flow.pipeline.sources import KafkaSource
from flow.pipeline.state import FeatureState
from flow.storage import location
from pipelines.ctr_streaming import ctr_streaming
from spark_jobs import partitions, validate
from spark_jobs.conf import session_conf
from spark_jobs.features import Featurizer
from spark_jobs.jvm import codegen_text, executed_plan
from spark_jobs.live import inplan, plan
from spark_jobs.live.batch_facts import Dropped, state_operators
from spark_jobs.live.counts import Seen
from spark_jobs.live.parts import WriterParts
from spark_jobs.live.plan import (
    JOIN_STATE_FORMAT,
    POSITIVES_KEY,
    STATE_STORES,
    TRACK_STATE_ROWS,
    LiveQuery,
    spark_counts_state,
)
from spark_jobs.live.records import EVENT_TIME, RECORD, late_reason_sql, late_sql
from spark_jobs.live.supervise import Watch
from spark_jobs.validate import REASON, parse_kafka


class _Conf:
    """What a LiveQuery sets on its session, and nothing else of Spark."""

    def __init__(self) -> None:
        self.set_to: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        self.set_to[key] = value

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.set_to.get(key, default)


class _PlannedError(Exception):
    """Raised where the query would build its frame: the settings are made by then."""


def _query(
    tmp_path: Path,
    partitions: int | None = None,
    strategy: Literal["window", "immediate"] = "window",
) -> tuple[LiveQuery, _Conf]:
    pipeline = ctr_streaming(label_strategy=strategy)
    stage = replace(pipeline.stage("live", LiveStage), partitions=partitions)
    conf = _Conf()
    spark = cast(SparkSession, SimpleNamespace(conf=conf))
    stack = StackConfig.from_env({"FLOW_HOME": str(tmp_path)})
    return LiveQuery(spark, stack, pipeline, stage, RunOptions()), conf


def _started(
    query: LiveQuery, monkeypatch: pytest.MonkeyPatch, *, made_with_a_join: bool = False
) -> None:
    def frame(_self: LiveQuery, _writer: Any = None) -> DataFrame:
        raise _PlannedError

    monkeypatch.setattr(LiveQuery, "stream_frame", frame)
    monkeypatch.setattr(plan, "holds_a_join", lambda _spark, _checkpoint: made_with_a_join)
    with pytest.raises(_PlannedError):
        query.start(cast(Any, None), cast(Any, None), Watch())


def test_rocksdb_keeps_no_running_count_of_the_rows_in_state() -> None:
    """The count costs a read before every write (1.2 -> 0.75 s of CPU a task of the stateful
    stage); the report reads the join's state from the checkpoint instead."""
    assert STATE_STORES["rocksdb"][TRACK_STATE_ROWS] == "false"
    assert not spark_counts_state("rocksdb")
    assert spark_counts_state("memory")


def test_a_label_join_keeps_its_state_in_one_rocksdb_store_a_partition() -> None:
    """State format 3: one store with column families, not four stores, each committed and
    synced every batch (the join's commit 0.64-0.80 -> 0.15-0.20 s of task time a batch). The
    memory store cannot keep it, and says Spark's default even after a RocksDB stage set 3."""
    assert STATE_STORES["rocksdb"][JOIN_STATE_FORMAT] == "3"
    assert STATE_STORES["memory"][JOIN_STATE_FORMAT] == "2"


def test_the_query_starts_with_the_smallest_watermark_its_store_and_its_partitions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    query, conf = _query(tmp_path, partitions=3)
    _started(query, monkeypatch)
    assert conf.set_to["spark.sql.streaming.multipleWatermarkPolicy"] == "min"
    assert conf.set_to[TRACK_STATE_ROWS] == "false"  # the stage's store: RocksDB by default
    assert conf.set_to[JOIN_STATE_FORMAT] == "3"
    assert conf.set_to["spark.sql.shuffle.partitions"] == "3"
    assert query.positives == "processor"


def test_immediate_positives_come_from_the_processor_unless_a_join_came_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The processor (transformWithState, event-time timers) is the default: Spark's stream-
    stream join scans its whole state every batch, so its batches grow with the window's
    impressions (SPARK-55144). A checkpoint made with the join keeps it (the processor cannot
    take its state over), and so does the memory store (transformWithState needs RocksDB)."""
    query, _conf = _query(tmp_path, 2, strategy="immediate")
    _started(query, monkeypatch)
    assert query.positives == "processor"
    _started(query, monkeypatch, made_with_a_join=True)
    assert query.positives == "join"
    in_memory, _conf = _query(tmp_path, 2, strategy="immediate")
    in_memory.stage = replace(in_memory.stage, state_store="memory")
    _started(in_memory, monkeypatch)
    assert in_memory.positives == "join"


def test_a_checkpoint_not_made_yet_holds_no_operators_and_spark_is_not_asked(
    tmp_path: Path,
) -> None:
    """(Spark's state metadata reader would warn on the console that it found no state.)"""
    nothing = cast(SparkSession, SimpleNamespace())  # any use of it raises
    assert state_operators(nothing, location(str(tmp_path / "new"))) == set()
    (tmp_path / "made" / "offsets").mkdir(parents=True)  # started, no stateful batch yet
    assert state_operators(nothing, location(str(tmp_path / "made"))) == set()


def test_the_positives_operator_can_be_named_at_launch_and_a_wrong_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    query, conf = _query(tmp_path, 2, strategy="immediate")
    conf.set(POSITIVES_KEY, "join")
    _started(query, monkeypatch)
    assert query.positives == "join"
    conf.set(POSITIVES_KEY, "processor")
    with pytest.raises(ConfigError, match=r"made with the label join.*new checkpoint"):
        _started(query, monkeypatch, made_with_a_join=True)
    conf.set(POSITIVES_KEY, "procesor")
    with pytest.raises(ConfigError, match=r"positives=procesor: write one of processor"):
        _started(query, monkeypatch)


class _Launched:
    def __init__(self, keys: Sequence[str]) -> None:
        self.keys = set(keys)

    def contains(self, key: str) -> bool:
        return key in self.keys


@pytest.mark.parametrize(
    ("launched", "cores", "expected"),
    [
        ((), 1, 2),  # a one-core worker: two, never Spark's 200
        ((), 6, 6),
        (("spark.sql.shuffle.partitions",), 6, None),  # what the launch said is kept
    ],
)
def test_shuffle_partitions_follow_the_cluster_never_spark_s_200(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    launched: tuple[str, ...],
    cores: int,
    expected: int | None,
) -> None:
    query, _ = _query(tmp_path)
    # The rule lives in spark_jobs.partitions, beside the batch stages' (one rule, two users).
    monkeypatch.setattr(partitions, "launch_conf", lambda _spark: _Launched(launched))
    monkeypatch.setattr(partitions, "default_parallelism", lambda _spark: cores)
    assert query.partitions() == expected
    query.stage = replace(query.stage, partitions=5)
    assert query.partitions() == 5  # the stage's own setting wins


def test_a_local_session_shuffles_into_one_partition_a_core(tmp_path: Path) -> None:
    """What LiveQuery.partitions keeps when the session was launched with it."""
    stack = StackConfig.from_env({"FLOW_HOME": str(tmp_path)})
    cores = max(2, os.cpu_count() or 2)
    assert session_conf(stack, local=True)["spark.sql.shuffle.partitions"] == str(cores)


# -- on Spark: what the plan keeps out, what it runs once ---------------------------------------


def _topic(spark: SparkSession, topic: str) -> DataFrame:
    """A static frame in the Kafka source's layout, its values computed (no constant to fold)."""
    return spark.range(4).select(
        F.lit(None).cast("binary").alias("key"),
        F.concat(F.lit('{"id": "'), F.col("id").cast("string"), F.lit('"}'))
        .cast("binary")
        .alias("value"),
        F.lit(topic).alias("topic"),
        F.lit(0).alias("partition"),
        F.col("id").alias("offset"),
        F.timestamp_seconds(F.col("id")).alias("timestamp"),
        F.lit(0).alias("timestampType"),
    )


def _generated_code(df: DataFrame) -> list[str]:
    """The Java source Spark generates for ``df``'s plan, code lines only."""
    return [line for line in codegen_text(df).splitlines() if line.startswith("/* ")]


@pytest.mark.integration
def test_the_late_threshold_stays_out_of_the_generated_code(spark: SparkSession) -> None:
    """Both writers judge lateness with late_sql and late_reason_sql: a new threshold every batch
    must compile no new class (12-14 classes a batch with the values in the code)."""
    records = spark.range(4).select(
        F.struct(
            F.lit("impressions").alias("source"),
            F.lit("").alias(REASON),
            F.timestamp_seconds(F.col("id") + 1_795_000_000).alias(EVENT_TIME),
        ).alias(RECORD)
    )

    def late(threshold_ms: int) -> DataFrame:
        reason = late_reason_sql(threshold_ms, {"impressions": "10 minutes"}, RECORD)
        return records.where(late_sql(threshold_ms)).selectExpr(f"{reason} AS reason")

    assert _generated_code(late(1_795_481_402_081)) == _generated_code(late(7))


@pytest.mark.integration
def test_the_parse_runs_from_json_once_a_record_not_once_a_check(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The valid records' filter reads the reason, which reads every check: without the parse's
    barriers the optimizer inlines ``from_json`` into each (200,000 records: 3.1 s -> 15.1 s)."""
    source = ctr_streaming().sources["impressions"]
    assert isinstance(source, KafkaSource)

    def parsings() -> int:
        valid = parse_kafka(_topic(spark, "impressions"), source, "impressions")
        plan_text = str(executed_plan(valid.where(F.col(REASON) == "")).toString())
        return plan_text.count("from_json(")

    assert parsings() == 1
    monkeypatch.setattr(validate, "barrier", lambda column: column)
    assert parsings() > 1, "the barrier no longer matters"


@pytest.mark.integration
def test_a_stream_s_vocabularies_are_scanned_from_files_not_shipped_in_every_task(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Each micro-batch broadcasts every vocabulary again. From a local relation each of those
    jobs' tasks carried the vocabulary (2.8 MB a task at 100,000 values, every batch); the live
    stage's featurizer scans a Parquet file written once instead, and its rows are the same."""
    spec = FeatureSpec(
        "vocab", (Vocabulary("word", max_size=MAX_VOCABULARY), Vocabulary("small")), label="y"
    )
    words = [f"w{i:06d}" for i in range(MAX_VOCABULARY)]
    state = FeatureState(
        spec.name, spec.fingerprint, vocabularies={"word": words, "small": ["e997", "e1994"]}
    )
    frame = spark.range(0, 2 * MAX_VOCABULARY, 997).select(
        F.format_string("w%06d", "id").alias("word"),
        F.when(F.col("id") % 3 > 0, F.format_string("e%d", "id")).alias("small"),
        (F.col("id") % 2).alias("y"),
    )
    tables = location(str(tmp_path / "vocabularies"))
    from_files = Featurizer(spark, spec, state, tables).apply(frame)
    plan = str(executed_plan(from_files).toString())
    assert "LocalTableScan [_key_word" not in plan, plan
    assert "FileScan parquet [_key_word" in plan, plan
    # A small vocabulary (under SHIPPED_BYTES) stays in the tasks: a scan would cost more.
    assert "LocalTableScan [_key_small" in plan, plan
    from_driver = Featurizer(spark, spec, state).apply(frame)
    assert "LocalTableScan [_key_word" in str(executed_plan(from_driver).toString())
    assert sorted(from_files.collect()) == sorted(from_driver.collect())
    # Another featurizer of the same state (a restarted stage) finds the files written.
    written = {p: p.stat().st_mtime_ns for p in (tmp_path / "vocabularies").rglob("*.parquet")}
    Featurizer(spark, spec, state, tables)
    assert len(written) == 1
    assert written == {p: p.stat().st_mtime_ns for p in written}


# -- the pending ledger, kept before the training commit ------------------------------------


def test_a_batch_s_dead_letters_are_kept_before_its_training_commit_and_appended_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run killed between the training commit and the ledger's append leaves the kept file,
    which the next run appends; kept after the commit, a kill in between would lose them. The
    append itself runs beside the next batch (the batch's job starts 0.76-1.07 s in, not
    1.2-1.4 s)."""
    steps: list[str] = []
    training = SimpleNamespace(
        channel=SimpleNamespace(name="live", wait_for_room=lambda _said: 0.0),
        last=-1,
        writer="w",
        options=lambda seed: None,
        source_positions=lambda batch_id: {},
    )
    parts = WriterParts(
        cast(SparkSession, None),
        ctr_streaming().stage("live", LiveStage),
        "p",
        [],
        query_name="p.live",
        checkpoint=cast(Any, SimpleNamespace(child=lambda name: None)),
        ledger=cast(Any, SimpleNamespace(last=-1)),
        featurizer=cast(Any, None),
        dimensions=cast(Any, SimpleNamespace(changed=list)),
    )
    writer = inplan.InPlanWriter(parts, cast(Any, training))
    writer.pending = cast(
        Any,
        SimpleNamespace(
            keep=lambda batch_id, letters, counts: steps.append(f"keep {batch_id}"),
            append_soon=lambda batch_id: steps.append(f"append {batch_id}"),
        ),
    )
    writer._schema, writer._meta = cast(Any, object()), cast(Any, object())
    monkeypatch.setattr(inplan, "late_threshold_ms", lambda checkpoint, batch_id: 0)
    monkeypatch.setattr(inplan, "set_local_property", lambda spark, key, value: None)
    monkeypatch.setattr(inplan, "_letters", lambda found: None)
    monkeypatch.setattr(inplan, "commit_shards", lambda *args: steps.append(f"commit {args[2]}"))
    monkeypatch.setattr(
        inplan.InPlanWriter,
        "_kept",
        lambda self, batch, threshold: SimpleNamespace(collect=list),
    )
    monkeypatch.setattr(inplan.InPlanWriter, "_seen", lambda self, found: Seen())
    monkeypatch.setattr(inplan, "dropped_rows", lambda spark, name, kind: Dropped())
    writer(cast(DataFrame, None), 0)
    assert steps == ["keep 0", "commit 0", "append 0"]
