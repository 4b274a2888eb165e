"""What a live stage's streaming query does with each micro-batch (its ``foreachBatch``), where
its writes cannot be in the streaming plan itself (spark_jobs.live.inplan.unsupported says which
stages: an Iceberg table output, a shuffle_key, a Delta enrichment; the run says so in one line).
Both writers keep one protocol: the same parts (spark_jobs.live.parts), the same counts
(spark_jobs.live.counts), each batch id committed once to each sink.

The query hands over two kinds of rows in one batch (``_kind``, spark_jobs.live.records): every
record the batch read from Kafka, in the dead-letter layout with its reason ('' if valid) and its
event time (``record``), and the rows the label join emitted (``row``). The writer accounts for
every record in the batch's commit: counted per source, the invalid ones (malformed,
out-of-range event time) and the late ones (at or before the late-event watermark, which
Spark's operators drop) written as dead letters with their reason, the duplicates Spark dropped
counted; and it enriches, featurizes and appends the joined rows.

Three Spark jobs a batch, each over the batch enriched and cached once: one aggregation (it runs
the stateful operators, so it comes first) counts the records per source, the invalid and late
ones, the rows that cannot train and the keys each enrichment did not find; the training rows
are featurized and exported (the tasks writing the shards count the positives); beside the
export, the dead letters are appended with the counts in the same Iceberg commit. (It was
eight jobs one after another: a count, a second cache of the records, their counts, the
positives, the unusable rows twice; 10.2 s -> 8.0 s a batch of 50,000 on 2 cores.) The
writes are planned on the driver while the counts job runs, and the export's job starts once
that job has filled the cache, while it finishes its aggregation (spark_jobs.live.job_watch); the
dead letters wait for the counts, which their commit carries.

Structured Streaming may run a batch id again after a failure; the writer commits a batch id once
to each of its two sinks (the training rows, the dead-letter ledger), each of which knows the
last id it committed, so a replay writes nothing twice. Counts are computed from the batch
itself, from the offset log and from the batch's operator metrics: a replay computes the same.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from pyspark import inheritable_thread_target
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.joins import UNMATCHED, dedup_kind
from spark_jobs.live.batch_facts import dropped_rows, late_threshold_ms
from spark_jobs.live.counts import Seen, batch_counts, records_read
from spark_jobs.live.job_watch import JobWatch, cache_loaded, wait_until
from spark_jobs.live.parts import WriterParts
from spark_jobs.live.records import (
    EVENT_TIME,
    KIND,
    RECORD,
    first_row,
    late_reason,
    late_sql,
    unmatched,
)
from spark_jobs.live.steps import BatchSteps, StepClock
from spark_jobs.outputs import TrainingSink
from spark_jobs.rows import missing, unusable_letters, unusable_reason
from spark_jobs.sinks import dead_letter_rows
from spark_jobs.stage import enriched
from spark_jobs.validate import REASON

__all__ = ["BatchWriter", "StreamWriter"]

BatchWriter = Callable[[DataFrame, int], None]
_SOURCE, _INVALID, _LATE = "_source", "_invalid", "_late"
"""A record's source, and whether it is invalid or late, beside it (StreamWriter._accounted)."""


class StreamWriter:
    """One live stage's micro-batches: records accounted for, joined rows trained on."""

    def __init__(self, parts: WriterParts, training: TrainingSink) -> None:
        self.parts, self.training = parts, training
        self.spark, self.stage, self.ledger = parts.spark, parts.stage, parts.ledger
        self.records_read: dict[int, int] = {}
        """Kafka records each batch read (all sources), by batch id."""
        self.steps: BatchSteps = {}
        """Its steps' seconds, by batch id: ``checks``, then ``job`` (the jobs and both commits,
        which overlap here)."""

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        if batch_id <= min(self.training.last, self.ledger.last):
            return  # a replay of a batch already committed in full
        clock = StepClock()
        # The joined rows are enriched (and derived) before the batch is cached: the counts (rows
        # that cannot train, keys an enrichment did not find) and the export read them, made once.
        # Every action on `batch` would run the stateful operators again: computed once, cached.
        # Of the records, the cache keeps what the counts need; the payload of dead letters only.
        threshold = late_threshold_ms(self.parts.checkpoint, batch_id)
        batch = self._accounted(enriched(batch, self.stage, self.parts.dimensions.side), threshold)
        batch = batch.persist()
        # The writes are planned (the features' joins, the dead letters, the channel's checks,
        # the export's plan: Python and Spark's analysis on the driver, ~1 s a batch) in a thread
        # once the counts job is submitted, and the export's job starts once the counts job has
        # stored every partition of the cache (spark_jobs.live.job_watch says why not sooner); the
        # dead letters wait for the counts, which their commit carries. inheritable_thread_target:
        # their jobs keep the streaming batch's properties.
        run = inheritable_thread_target(self.spark)
        counted, failed = threading.Event(), threading.Event()
        planned: Future[tuple[DataFrame, DataFrame]] = Future()
        jobs = JobWatch(self.spark)
        clock.lap("checks")
        try:
            with ThreadPoolExecutor(1, thread_name_prefix="batch-writes") as pool:
                exported = pool.submit(
                    run(self._plan_and_export), batch, threshold, batch_id, planned, jobs,
                    counted, failed,
                )  # fmt: skip
                try:
                    # The first action: it runs the stateful operators, so their metrics are
                    # final after it.
                    seen = self._seen(batch)
                    dropped = dropped_rows(self.spark, self.parts.query_name, dedup_kind)
                    counts = batch_counts(self.stage, self._names, seen, dropped)
                except BaseException:
                    failed.set()
                    raise
                finally:
                    counted.set()
                self.records_read[batch_id] = records_read(counts)
                letters, unusable = planned.result()
                if seen.unusable:
                    letters = letters.unionByName(unusable)
                letters = dead_letter_rows(letters, self.parts.pipeline, self.stage.name)
                # The two commits are independent (each sink knows the last batch it committed;
                # a replay redoes only what is missing): the Iceberg commit of the dead letters,
                # mostly the driver's metadata writes, runs while the export's tasks run.
                self.ledger.append(letters, batch_id, counts, few=True)
                exported.result()
        finally:
            batch.unpersist()
        clock.lap("job")
        self.steps[batch_id] = clock.seconds

    def _plan_and_export(
        self,
        batch: DataFrame,
        threshold: int,
        batch_id: int,
        planned: Future[tuple[DataFrame, DataFrame]],
        jobs: JobWatch,
        counted: threading.Event,
        failed: threading.Event,
    ) -> None:
        """:meth:`_plan` beside the counts job, then the export once the cache is filled."""
        wait_until(jobs.staged_job_submitted, stop=counted)
        try:
            letters, unusable, export = self._plan(batch, threshold, batch_id)
        except BaseException as error:
            planned.set_exception(error)
            raise
        planned.set_result((letters, unusable))
        wait_until(cache_loaded(batch), stop=counted)
        if not failed.is_set():
            export()

    def _plan(
        self, batch: DataFrame, threshold: int, batch_id: int
    ) -> tuple[DataFrame, DataFrame, Callable[[], None]]:
        """What the batch writes, planned without a Spark job: its invalid and late records,
        its rows that cannot train (both as dead letters), and the training rows' write."""
        spec, enrichments = self.stage.features, self.stage.enrich
        rows = batch.where((F.col(KIND) == "row") & ~unmatched(self.stage))
        rows = rows.drop(KIND, RECORD, _SOURCE, _INVALID, _LATE, UNMATCHED)
        first = rows.where(first_row(self.stage))
        unusable = unusable_letters(first, spec, self.stage.events, enrichments)
        usable = rows.where(unusable_reason(spec, enrichments) == "")
        export = self.training.prepare(self.parts.featurizer.apply(usable), batch_id)
        return self._dead_records(batch, threshold), unusable, export

    @property
    def _names(self) -> list[str]:
        return [name for name, _ in self.parts.sources]

    def _late(self, threshold_ms: int) -> Column:
        """Whether a record (of :data:`RECORD`) is valid but at or before the threshold."""
        return F.expr(late_sql(threshold_ms))

    def _accounted(self, batch: DataFrame, threshold_ms: int) -> DataFrame:
        """``batch`` with each record's source and whether it is invalid or late as columns of
        their own, and its :data:`RECORD` (raw bytes included) only if it is a dead letter:
        what the batch's cache holds of a record that is fine is three small columns."""
        record = F.col(RECORD)
        is_record = F.col(KIND) == "record"
        invalid = is_record & (record[REASON] != "")
        late = is_record & self._late(threshold_ms)
        return batch.withColumns(
            {
                _SOURCE: F.when(is_record, record["source"]),
                _INVALID: invalid,
                _LATE: late,
                RECORD: F.when(invalid | late, record),
            }
        )

    def _seen(self, batch: DataFrame) -> Seen:
        """Per source: records read, invalid, late; of the joined rows (events' first rows),
        those that cannot train and, per enrichment, those whose key it did not find; the label
        events that labelled nothing. One aggregation over the batch (as :meth:`_accounted`
        left it); spark_jobs.live.counts makes the counts of it."""
        is_record = F.col(KIND) == "record"
        first = ~is_record & first_row(self.stage)
        flags = {
            "input": is_record,
            "invalid": F.col(_INVALID),
            "late": F.col(_LATE),
            "unusable": first & (unusable_reason(self.stage.features, self.stage.enrich) != ""),
            "unmatched": ~is_record & unmatched(self.stage),
        }
        names = list(missing(self.stage.enrich))
        for i, flag in enumerate(missing(self.stage.enrich).values()):
            flags[f"missing{i}"] = first & flag
        totals = batch.groupBy(F.col(_SOURCE).alias("source")).agg(
            *[F.sum(flag.cast("int")).alias(kind) for kind, flag in flags.items()]
        )
        per_source: dict[str, dict[str, int]] = {"input": {}, "invalid": {}, "late": {}}
        # The joined rows carry no record, so no source: theirs are the stage's counts.
        of_rows: Counter[str] = Counter()
        for row in totals.collect():
            for kind in flags:
                value = int(row[kind] or 0)
                if kind in per_source:
                    if row["source"] is not None:
                        per_source[kind][row["source"]] = value
                else:
                    of_rows[kind] += value
        return Seen(
            inputs=per_source["input"],
            invalid=per_source["invalid"],
            late=per_source["late"],
            unusable=of_rows["unusable"],
            missing={name: of_rows[f"missing{i}"] for i, name in enumerate(names)},
            unmatched=of_rows["unmatched"],
        )

    def _dead_records(self, batch: DataFrame, threshold_ms: int) -> DataFrame:
        """The batch's invalid records and its late ones, each with its reason."""
        records = batch.where(F.col(_INVALID) | F.col(_LATE)).select(f"{RECORD}.*", _LATE)
        watermarks = {name: source.watermark for name, source in self.parts.sources}
        reason = F.when(F.col(_LATE), late_reason(threshold_ms, watermarks)).otherwise(
            F.col(REASON)
        )
        return records.withColumn("reason", reason).drop(REASON, _LATE, EVENT_TIME)
