"""A live stage: Kafka events, labelled by a stream-stream join, enriched, featurized, written.

One Structured Streaming query per stage, checkpointed under
``$FLOW_CHECKPOINTS/<namespace>/<pipeline>/<stage>/stream`` (``$FLOW_HOME/checkpoints`` on one
machine; on a cluster, storage every worker shares: S3 through Hadoop's S3A). Each micro-batch
hands its writer every record it read, with its reason if it is bad, beside the rows the label
join emitted: so records are counted, malformed, out-of-range and late ones dead-lettered with
their reason and duplicates counted, in the same commit as the training rows, and every count
reconciles across restarts.

* **Event time.** A record whose event time is further than ``max_future`` ahead of (or
  ``max_past`` behind) the batch's processing time is a dead letter before any watermark sees
  it: one bad clock cannot move the watermark.
* **Watermark.** The query takes the smallest of its inputs' watermarks
  (``spark.sql.streaming.multipleWatermarkPolicy=min``, Spark's default): an impression is only
  called a negative once the label topic, too, has moved past its window. With the largest, a
  label topic ahead of the events (a backlog worked off in capped batches: the clicks of hours
  arrive in the first batch) made the events behind it late, and a silent label topic (its
  producer down) made every impression a negative. The price: a restarted query keeps its
  checkpointed watermark until every input has had data again (for CTR, the first click).
* **Supervision.** A query that fails is started again from its checkpoint, with backoff, up to
  ``RunOptions.max_restarts`` times (a broker outage of minutes, a topic not created yet, a task
  failure); each restart is one line and an MLflow metric, naming the root cause's class and
  message (spark_jobs.failures). Causes no restart mends are not retried: errors of the
  pipeline itself (FlowError), a full disk, a write refused. ``--duration`` counts from the
  first start, restarts included.

Every commit carries its writer and batch id, so a replayed batch writes nothing twice.

Where the stage allows it (a handoff output, either label strategy: the default path), the
enrichment, features and shard writers are part of the query's own plan and a micro-batch is
one Spark job (spark_jobs.live.inplan); otherwise (an Iceberg table output, a shuffle_key, a
Delta enrichment) the writer plans and runs them over each batch
(spark_jobs.live.stream_writer). Which one runs is one line of the run and an MLflow tag on the
stage's run (``flow.live.writer``, ``flow.live.writer_reason``). Both make a batch's counts in
one place (spark_jobs.live.counts), label events that labelled nothing among them.

The package's one public name is :func:`run_live`. Its modules, and the performance mechanisms
a refactor could undo with the tests that guard them, are listed in its README.md.
"""

from spark_jobs.live.run import run_live

__all__ = ["run_live"]
