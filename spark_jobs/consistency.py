"""A committed channel's training rows against the Python transform of their raw inputs.

    flow check consistency NAMESPACE CHANNEL [--pipeline pipelines/x.py] [--rows N]
    spark-submit $(flow spark-args) spark_jobs/consistency.py NAMESPACE CHANNEL [...]

The raw inputs are found from what the commit records: a backfill's commit lists the snapshot
of every table it read (``<source>.snapshot_id``). The stage's sources are pinned to those
snapshots and its own phases (validation, label join, enrichment, Derived columns) run again in
Spark, which gives each row's feature inputs exactly as the stage saw them; only the features
are then computed by flow.transform, in Python, and compared with what Spark committed. Rows are
matched on a passthrough column that names one row (``--key``; default: the label join key).

A live channel's inputs were Kafka records, which retention may have removed since: the check
reads backfill channels (the live stage featurizes with the same Featurizer and state).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from flow.config import StackConfig
from flow.console import reporting_errors
from flow.errors import ConfigError
from flow.pipeline.features import FeatureSpec
from flow.pipeline.model import BackfillStage, Pipeline
from flow.pipeline.sources import IcebergSource
from flow.pipeline.state import FeatureState, states_location
from flow.transform.consistency import Consistency, by_key, committed_sample
from flow.workflows.retrain import load_pipeline
from spark_jobs.backfill import BackfillRun
from spark_jobs.rows import channel_for
from spark_jobs.session import get_session
from spark_jobs.stage import enriched

__all__ = ["check_channel", "main", "pinned", "raw_inputs"]


@dataclasses.dataclass
class ChannelCheck:
    """What :func:`check_channel` found: the report, and the rows it could not match."""

    channel: str
    batch_id: int
    key: str
    report: Consistency
    unmatched: int
    committed: pa.Table = dataclasses.field(repr=False)
    """The committed rows checked."""
    raw: pa.Table = dataclasses.field(repr=False)
    """Their feature inputs, as the stage's Spark phases gave them."""

    def against(self, spec: FeatureSpec, state: FeatureState) -> ChannelCheck:
        """The same rows checked against another spec or state, with no Spark work (a test
        changing a vocabulary or a clip bound shows that the check names the feature)."""
        report, unmatched = by_key(spec, state, self.committed, self.raw, self.key)
        return dataclasses.replace(self, report=report, unmatched=unmatched)

    @property
    def ok(self) -> bool:
        return self.report.ok and not self.unmatched

    def lines(self) -> list[str]:
        head = f"channel {self.channel!r}, commit {self.batch_id}, rows matched on {self.key!r}"
        out = [head, *self.report.lines()]
        if self.unmatched:
            out.append(
                f"  {self.unmatched:,} committed rows have no single raw row with their "
                f"{self.key!r} (none, or several): not checked"
            )
        return out


def pinned(pipeline: Pipeline, positions: dict[str, object]) -> Pipeline:
    """``pipeline`` with each Iceberg source read at the snapshot a commit recorded for it."""
    sources = dict(pipeline.sources)
    for name, source in pipeline.sources.items():
        snapshot = positions.get(f"{name}.snapshot_id")
        if isinstance(source, IcebergSource) and snapshot is not None:
            # The whole table at that snapshot: a superset of an incremental read's rows, and
            # the rows are matched by key.
            sources[name] = dataclasses.replace(
                source, snapshot_id=int(str(snapshot)), since_snapshot=None, as_of=None
            )
    return dataclasses.replace(pipeline, sources=sources)


def raw_inputs(
    spark: SparkSession, stack: StackConfig, pipeline: Pipeline, stage: BackfillStage
) -> DataFrame:
    """The stage's usable rows as its features read them: validated, labelled, enriched,
    derived (the backfill's own phases, over ``pipeline``'s sources as given)."""
    run = BackfillRun(spark, pipeline, stage, stack, None, lambda _: None)
    rows = run.read_events()
    if stage.label is not None:
        rows = run.label(rows, stage.label)
    return run.usable(enriched(rows, stage, run.dimension))


def _key(pipeline: Pipeline, stage: BackfillStage, key: str | None) -> str:
    passthrough = stage.features.passthrough
    chosen = key or (stage.label.key if stage.label is not None else None)
    if chosen is None or chosen not in passthrough:
        raise ConfigError(
            f"stage {stage.name!r}: the check matches committed rows to raw rows on a "
            f"passthrough column that names one row; give --key (passthrough: "
            f"{', '.join(passthrough) or 'none'}), or add the event id to FeatureSpec.passthrough"
        )
    return chosen


def check_channel(
    spark: SparkSession,
    stack: StackConfig,
    pipeline: Pipeline,
    channel: str,
    *,
    rows: int = 2000,
    batch_id: int | None = None,
    key: str | None = None,
) -> ChannelCheck:
    """Check up to ``rows`` rows of commit ``batch_id`` (default: the last) of ``channel``
    against the feature state the channel names."""
    stage = next((s for s in pipeline.stages if s.channel == channel), None)
    if not isinstance(stage, BackfillStage):
        kind = "no stage" if stage is None else f"live stage {stage.name!r}"
        raise ConfigError(
            f"pipeline {pipeline.name!r}: {kind} writes channel {channel!r}; the check reads "
            "backfill channels, whose commits pin the tables they read"
        )
    reasons = pipeline.outside_spark[stage.name]
    if reasons:
        raise ConfigError(f"stage {stage.name!r} cannot be featurized outside Spark: {reasons}")
    found = channel_for(stack, pipeline, channel)
    ids = found.commit_ids() if found.exists() else []
    if not ids:
        raise ConfigError(f"channel {channel!r} in {found.root} has no commits to check")
    batch = ids[-1] if batch_id is None else batch_id
    if batch not in ids:
        raise ConfigError(f"channel {channel!r} has no commit {batch}; commits: {ids}")
    commit = found.commit(batch)
    version = found.meta().feature_state
    state = FeatureState.load(states_location(stack, pipeline.namespace), stage.features, version)
    column = _key(pipeline, stage, key)
    committed = committed_sample(found, batch, rows)
    inputs = raw_inputs(spark, stack, pinned(pipeline, commit.source_positions), stage)
    wanted = spark.createDataFrame(pa.table({column: committed.column(column)}))
    raw = inputs.join(F.broadcast(wanted), column, "left_semi").toArrow()
    report, unmatched = by_key(stage.features, state, committed, raw, column)
    return ChannelCheck(channel, batch, column, report, unmatched, committed, raw)


def _pipeline_for(namespace: str, channel: str, given: str | None) -> Pipeline:
    """The pipeline file ``given``, or pipelines/<name>.py of the pipeline that wrote the
    channel's last commit (its writer is ``<pipeline>.<stage>``)."""
    if given is not None:
        pipeline = load_pipeline(given, namespace)
    else:
        from flow.handoff import Channel
        from flow.storage import namespace_locations

        stack = StackConfig.from_env()
        found = Channel(namespace_locations(stack, namespace).handoff.uri, channel)
        ids = found.commit_ids() if found.exists() else []
        if not ids:
            raise ConfigError(
                f"channel {channel!r} of namespace {namespace!r} has no commits in "
                f"{found.root}; give --pipeline if its pipeline writes elsewhere"
            )
        name = found.commit(ids[-1]).writer.split(".")[0]
        path = Path("pipelines") / f"{name}.py"
        if not path.exists():
            raise ConfigError(
                f"channel {channel!r} was written by pipeline {name!r}; no {path} here: give "
                "--pipeline FILE"
            )
        pipeline = load_pipeline(str(path), namespace)
    if pipeline.namespace != namespace:
        raise ConfigError(
            f"pipeline {pipeline.name!r} writes namespace {pipeline.namespace!r}, not {namespace!r}"
        )
    return pipeline


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flow check consistency")
    parser.add_argument("namespace")
    parser.add_argument("channel")
    parser.add_argument("--pipeline", help="pipeline file (default: pipelines/<writer>.py)")
    parser.add_argument("--rows", type=int, default=2000, help="rows to check (default 2000)")
    parser.add_argument("--commit", type=int, help="commit to check (default: the last)")
    parser.add_argument("--key", help="passthrough column naming one row")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    with reporting_errors(list(argv or sys.argv[1:])):
        pipeline = _pipeline_for(args.namespace, args.channel, args.pipeline)
        stack = StackConfig.from_env()
        spark = get_session(stack, app_name=f"flow-check-{args.channel}")
        result = check_channel(
            spark, stack, pipeline, args.channel, rows=args.rows, batch_id=args.commit,
            key=args.key,
        )  # fmt: skip
    for line in result.lines():
        print(line, flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
