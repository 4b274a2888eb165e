"""Where a pipeline's stages write, each with the setting that chose it, and the probes that
find an unusable location before any work.

``flow run`` probes these before it starts a driver (:func:`check_run`, from the pipeline file's
check: flow.workflows.precheck), and the driver probes them again before its Spark session
(spark_jobs.runner): a missing bucket, an unwritable folder, a URI no filesystem understands or
a streaming checkpoint Spark cannot use is one line naming the setting to change, in a second,
not an error from the query 70 s in, after the executors started. Engine-neutral: the
locations are pyarrow's (flow.storage); only the checkpoint's Hadoop form is Spark's concern,
and :meth:`flow.storage.Location.check_checkpoint` checks it without Spark.
"""

from __future__ import annotations

from typing import NamedTuple

from flow.config import StackConfig
from flow.engine import RunOptions
from flow.pipeline.model import BackfillStage, HandoffOutput, LiveStage, Pipeline
from flow.storage import Location, check_storage, location, setting_location

__all__ = ["Output", "check_outputs", "check_run", "stage_outputs"]


class Output(NamedTuple):
    """A location a stage writes."""

    where: Location
    setting: str
    """The setting that chose it, as an error names it."""
    spark_checkpoint: bool = False
    """A streaming query's checkpoint: Spark's Hadoop filesystems must open it too."""


def stage_outputs(
    stack: StackConfig, pipeline: Pipeline, stage: BackfillStage | LiveStage, *, fits: bool
) -> list[Output]:
    """The locations ``stage`` writes: its handoff channel, the feature states it saves
    (``fits``), a live stage's checkpoints and, on a local warehouse, the Iceberg tables (dead
    letters, training tables)."""
    found: list[Output] = []
    namespace = pipeline.namespace
    output = pipeline.output
    if isinstance(output, HandoffOutput):
        if output.location is None:
            root = setting_location(stack.handoff, "FLOW_HANDOFF", stack.s3).child(namespace)
            found.append(Output(root.child(stage.channel), "FLOW_HANDOFF"))
        else:
            setting = "HandoffOutput.location"
            root = setting_location(output.location, setting, stack.s3)
            found.append(Output(root.child(stage.channel), setting))
    if fits:
        states = setting_location(stack.feature_state, "FLOW_FEATURE_STATE", stack.s3)
        found.append(Output(states.child(namespace, stage.features.name), "FLOW_FEATURE_STATE"))
    if stage.streaming:
        setting = stack.checkpoints_from
        checkpoints = setting_location(stack.checkpoints, setting, stack.s3)
        where = checkpoints.child(namespace, pipeline.name, stage.name)
        found.append(Output(where, setting, spark_checkpoint=True))
    # Only a local warehouse: on an object store Iceberg writes with the catalog's own
    # credentials (FLOW_CATALOG_PROPERTIES), which a probe through pyarrow would not use.
    if stack.catalog.type == "sql" and stack.catalog.warehouse.startswith("file:"):
        found.append(Output(location(stack.catalog.warehouse), "FLOW_WAREHOUSE"))
    return found


def check_outputs(
    stack: StackConfig, pipeline: Pipeline, stage: BackfillStage | LiveStage, *, fits: bool
) -> None:
    """A ConfigError naming the setting to change unless ``stage`` can write every location it
    writes (a probe file, written and deleted, in each)."""
    check_storage(stack, "FLOW_WAREHOUSE")  # the tables it reads and writes, if in S3
    for output in stage_outputs(stack, pipeline, stage, fits=fits):
        if output.spark_checkpoint:
            output.where.check_checkpoint(output.setting)
        else:
            output.where.check_writable(output.setting)


def check_run(stack: StackConfig, pipeline: Pipeline, options: RunOptions) -> None:
    """:func:`check_outputs` of every stage ``options`` chooses, before the first one starts:
    a later stage's unwritable location is not found after an earlier one ran for an hour."""
    chosen = [s for s in pipeline.stages if not options.stages or s.name in options.stages]
    for stage in chosen:
        fits = isinstance(stage, BackfillStage) and stage.fit and options.feature_state is None
        check_outputs(stack, pipeline, stage, fits=fits)
