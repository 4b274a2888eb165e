"""A live stage's streaming query: the frame it runs, the settings it starts with, its state store.

The frame (:meth:`LiveQuery.stream_frame`) is the union of every record the batch read, in the
dead-letter layout with its reason and event time (kind ``record``, spark_jobs.live.records),
and the rows the label join emitted (kind ``row``), or, with the writes in the plan
(spark_jobs.live.inplan), what the writer tasks wrote of them. Each topic is read from Kafka and
parsed once a batch (:func:`_read_once`) though the plan uses its records twice or three times:
the accounting, the join (and, for ``immediate`` labels, the join again).

When it starts (:meth:`LiveQuery.start`) the query takes the smallest of its inputs'
watermarks, the stage's state store (:data:`STATE_STORES`) and a number of shuffle partitions
sized for the cluster (:meth:`LiveQuery.partitions`, never Spark's 200); a new checkpoint
records them, an existing one keeps those it was made with.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import MapType

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.pipeline.model import LiveStage, Pipeline
from flow.pipeline.run import RunOptions
from flow.pipeline.sources import PRODUCED_AT, KafkaSource
from flow.storage import Location
from spark_jobs.joins import POSITIVES, deduplicated, label_stream, label_stream_immediate
from spark_jobs.live.batch_facts import holds_a_join
from spark_jobs.live.inplan import InPlanWriter
from spark_jobs.live.records import KIND, record_column
from spark_jobs.live.stream_writer import StreamWriter
from spark_jobs.live.supervise import Watch, recording
from spark_jobs.partitions import shuffle_partitions
from spark_jobs.sources import read_kafka
from spark_jobs.validate import REASON, barrier, parse_kafka, with_time_checks

__all__ = [
    "JOIN_STATE_FORMAT",
    "POSITIVES_KEY",
    "STATE_STORES",
    "TRACK_STATE_ROWS",
    "LiveQuery",
    "spark_counts_state",
    "use_state_store",
]

POSITIVES_KEY = "spark.flow.positives"
"""A Spark setting that names the immediate strategy's operator for its positives (one of
spark_jobs.joins.POSITIVES) instead of the stage's choice (LiveQuery.choose_positives)."""
TRACK_STATE_ROWS = "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows"
JOIN_STATE_FORMAT = "spark.sql.streaming.join.stateFormatVersion"
STATE_STORES: dict[str, dict[str, str]] = {
    "rocksdb": {
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # One budget (500 MB by default) for every RocksDB instance of the process: a store per
        # partition and operator side, each with its own write buffers otherwise.
        "spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage": "true",
        # Spark's running count of the rows in state costs a read before every write: 1.2 ->
        # 0.75 s of CPU per task of the stateful stage, a batch of 50,000 on 2 cores. The report
        # reads the label join's state from the checkpoint instead (spark_jobs.live.batch_facts).
        TRACK_STATE_ROWS: "false",
        # A stream-stream join's state in one store a partition (RocksDB's column families), not
        # four: one commit, load and file sync where there were four. The label join's commit
        # 0.64-0.80 -> 0.15-0.20 s of task time a batch, a batch 3.7-4.7 -> 3.1-3.5 s (medians,
        # immediate labels at 2,000 impressions/s on 2 cores, three pairs of runs:
        # docs/experiments/2026-12-07-live-batch-anatomy.md). RocksDB only.
        JOIN_STATE_FORMAT: "3",
    },
    "memory": {
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
        ),
        # Spark's default, named: a session that ran a RocksDB stage before has 3, which this
        # store cannot keep.
        JOIN_STATE_FORMAT: "2",
    },
}
"""Spark's settings for each LiveStage.state_store; a new checkpoint records them, an existing
one keeps those it was made with (Spark reads them back from its offset log)."""


def use_state_store(spark: SparkSession, state_store: str) -> None:
    """Name ``state_store`` (a key of :data:`STATE_STORES`) on the session, for the queries whose
    checkpoints are made after this."""
    for key, value in STATE_STORES[state_store].items():
        spark.conf.set(key, value)


def spark_counts_state(state_store: str) -> bool:
    """Whether the query's progress counts the rows in state (``numRowsTotal``)."""
    return STATE_STORES[state_store].get(TRACK_STATE_ROWS, "true") == "true"


def _kafka(pipeline: Pipeline, name: str) -> KafkaSource:
    source = pipeline.sources[name]
    if not isinstance(source, KafkaSource):
        raise ConfigError(f"source {name!r} is not a Kafka topic; a live stage reads Kafka")
    return source


def _read_once(parsed: DataFrame) -> DataFrame:
    """``parsed`` behind one exchange, so that a topic is read from Kafka and parsed once.

    The stage's plan uses a topic's parsed records twice: every record for the accounting, the
    valid ones for the join. Spark plans each use as a scan and parse of its own; here both end
    in an identical exchange, which Spark runs once and reuses (``ReusedExchange``;
    ``spark.sql.exchange.reuse``, on by default). Identical takes two things: the exchange
    hashes every column, so column pruning can push no branch's projection below it, and the
    valid records' filter above it is not deterministic (``_valid``), so it is not pushed
    below it either. The records are shuffled once more than before; that costs less than the
    second read and parse it saves (~0.6 s of a 7-8 s batch of 50,000 impressions on 2 cores,
    docs/experiments/2026-11-24-live-stage-rate.md). Which partition a record lands in
    matters to nobody: the deduplication and the join shuffle by key again.
    """
    # Spark hashes no map: a map-typed field (none of the declared types is one today) would
    # only cost the reuse (its branch's exchange pruned apart), not the query.
    every = [F.col(f.name) for f in parsed.schema.fields if not isinstance(f.dataType, MapType)]
    # spark_partition_id(): the input partition (hence deterministic for a task, retried or
    # not), and not deterministic to the optimizer, which keeps the exchange as written.
    return parsed.repartition(F.xxhash64(*every, F.spark_partition_id()))


def _reader_options(source: KafkaSource) -> dict[str, str]:
    if source.max_records_per_batch is None:
        return {}
    return {"maxOffsetsPerTrigger": str(source.max_records_per_batch)}


class LiveQuery:
    """The streaming query of one run of a live stage: its frame, and how it starts."""

    def __init__(
        self,
        spark: SparkSession,
        stack: StackConfig,
        pipeline: Pipeline,
        stage: LiveStage,
        options: RunOptions,
    ) -> None:
        self.spark, self.stack, self.stage, self.options = spark, stack, stage, options
        self.events = _kafka(pipeline, stage.events)
        self.labels = (stage.label, _kafka(pipeline, stage.label.source)) if stage.label else None
        self.name = f"{pipeline.name}.{stage.name}"
        """The query's name (Spark's ``queryName``), by which its batches' plans are found."""
        self.positives = "processor"
        """The immediate strategy's operator for its positives (:meth:`choose_positives`)."""

    @property
    def sources(self) -> list[tuple[str, KafkaSource]]:
        """The topics the stage reads, by source name: events, then labels."""
        found = [(self.stage.events, self.events)]
        if self.labels is not None:
            found.append((self.labels[0].source, self.labels[1]))
        return found

    def _parsed(self, name: str, source: KafkaSource) -> DataFrame:
        raw = read_kafka(
            self.spark,
            self.stack.kafka,
            [source.topic],
            starting_offsets=source.starting_offsets,
            options=_reader_options(source),
        )
        return parse_kafka(raw, source, name, timed=False)

    def stream_frame(self, writer: StreamWriter | InPlanWriter | None = None) -> DataFrame:
        """Every record read (dead-letter layout, reason, event time) beside the joined rows
        (or, with the writes in the plan, what the writer tasks wrote of them)."""
        parsed = {
            name: with_time_checks(_read_once(self._parsed(name, source)), source)
            for name, source in self.sources
        }
        records = reduce(
            DataFrame.unionByName,
            [parsed[n].select(record_column(s.event_time)) for n, s in self.sources],
        ).withColumn(KIND, F.lit("record"))
        if isinstance(writer, InPlanWriter):
            counted = {name: writer.counted(frame, name) for name, frame in parsed.items()}
            rows = writer.rows(self.labelled_frame(parsed, counted), self.events)
        else:
            rows = self.labelled_frame(parsed).withColumn(KIND, F.lit("row"))
        return rows.unionByName(records, allowMissingColumns=True)

    def _valid(self, parsed: DataFrame, source: KafkaSource) -> DataFrame:
        """A source's valid records as its fields, and when each was produced (PRODUCED_AT).
        The filter is a barrier: pushed below ``_read_once``'s exchange, it would make this
        branch's exchange differ from the records' one, and the topic be read twice."""
        valid = parsed.where(barrier(F.col(REASON) == ""))
        names = [f.name for f in source.fields]
        produced = [] if PRODUCED_AT in names else [F.col("kafka_timestamp").alias(PRODUCED_AT)]
        return valid.select(*names, *produced)

    def labelled_frame(
        self, parsed: dict[str, DataFrame], counted: dict[str, DataFrame] | None = None
    ) -> DataFrame:
        """The valid events, deduplicated by their key and joined in the stream with their
        labels (watermarked) if any. ``counted``: the sources' records as the join reads them
        (observed), if not ``parsed``."""
        parsed = counted or parsed
        events = self.events
        rows = self._valid(parsed[self.stage.events], events)
        key = events.key or (self.labels[0].key if self.labels is not None else None)
        if self.labels is None:
            return deduplicated(rows, events.event_time, events.watermark, key) if key else rows
        label, source = self.labels
        sides = (
            rows,
            self._valid(parsed[label.source], source),
            label,
            events.event_time,
            events.watermark,
            source.event_time,
            source.watermark,
        )
        if label.strategy == "immediate":
            return label_stream_immediate(*sides, event_key=key, positives=self.positives)
        return label_stream(*sides, event_key=key)

    def choose_positives(self, checkpoint: Location) -> str:
        """How the immediate strategy will find its positives (spark_jobs.joins.POSITIVES):
        the processor, unless the state store is the memory one (transformWithState runs on
        RocksDB only), ``checkpoint`` was made with the join (its state is the join's: the
        query keeps it, as it keeps the settings it was made with), or the job was launched
        with ``--conf spark.flow.positives=join``."""
        asked = self.spark.conf.get(POSITIVES_KEY, None)
        if asked is not None and asked not in POSITIVES:
            raise ConfigError(
                f"--conf {POSITIVES_KEY}={asked}: write one of {', '.join(POSITIVES)}, or leave "
                "it out (the processor, or the join where the checkpoint was made with it)"
            )
        if self.stage.state_store != "rocksdb" or asked == "join":
            self.positives = "join"
            return self.positives
        made_with_a_join = holds_a_join(self.spark, checkpoint)
        if made_with_a_join and asked == "processor":
            raise ConfigError(
                f"--conf {POSITIVES_KEY}=processor: the checkpoint {checkpoint} was made with "
                "the label join, whose state the processor cannot take over; leave the setting "
                "out to keep the join, or start the stage on a new checkpoint"
            )
        self.positives = "join" if made_with_a_join else "processor"
        return self.positives

    def start(
        self, checkpoint: Location, writer: StreamWriter | InPlanWriter, watch: Watch
    ) -> StreamingQuery:
        # The smallest input watermark wins (spark_jobs.live's docstring says why), whatever the
        # session says; recorded in a new checkpoint (one made before keeps the policy it was
        # made with).
        self.spark.conf.set("spark.sql.streaming.multipleWatermarkPolicy", "min")
        use_state_store(self.spark, self.stage.state_store)
        if self.labels is not None and self.labels[0].strategy == "immediate":
            self.choose_positives(checkpoint)
        partitions = self.partitions()
        if partitions is not None:
            self.spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
        stream = (
            self.stream_frame(writer)
            .writeStream.queryName(self.name)
            .foreachBatch(recording(writer, watch))
            .option("checkpointLocation", checkpoint.hadoop_uri)
        )
        if self.options.mode == "continuous":
            stream = stream.trigger(processingTime=self.stage.trigger)
        else:
            stream = stream.trigger(availableNow=True)
        return stream.start()

    def partitions(self) -> int | None:
        """Shuffle (and so state-store) partitions for a new checkpoint: the stage's setting,
        else a ``spark.sql.shuffle.partitions`` launched with (the local session's is one per
        core: spark_jobs.conf) is kept, else the cluster's cores. Never Spark's 200: a stateful
        stage commits a state store per partition and operator every micro-batch, which on a
        one-core worker made batches of seconds take minutes."""
        return shuffle_partitions(self.spark, self.stage.partitions)
