"""Pipeline definitions: sources, joins, features and stages, validated when built.

    from flow.pipeline import Field, KafkaSource, IcebergSource, LiveStage, Pipeline, run_main

A definition is plain data; ``spark_jobs`` runs it (``flow run pipelines/x.py``), entering
through :func:`run_main` at the bottom of the file.

Importing this package makes a FlowError that nothing catches (a mistake in a definition built
at the top of a pipeline file) end the process with one line rather than a traceback; see
:func:`flow.console.install_excepthook`.
"""

from flow.console import install_excepthook
from flow.pipeline.features import (
    Bucketized,
    Cross,
    Feature,
    FeatureSpec,
    Hashed,
    HashedSequence,
    Id,
    Numeric,
    Vocabulary,
)
from flow.pipeline.history import History
from flow.pipeline.model import (
    BackfillStage,
    Derived,
    Enrich,
    HandoffOutput,
    LabelJoin,
    LiveStage,
    Output,
    Pipeline,
    Stage,
    TableOutput,
)
from flow.pipeline.run import RunOptions, run_main
from flow.pipeline.schema import Field
from flow.pipeline.sources import PRODUCED_AT, DeltaSource, IcebergSource, KafkaSource, Source
from flow.pipeline.state import FeatureState, Layout, layout

__all__ = [
    "PRODUCED_AT",
    "BackfillStage",
    "Bucketized",
    "Cross",
    "DeltaSource",
    "Derived",
    "Enrich",
    "Feature",
    "FeatureSpec",
    "FeatureState",
    "Field",
    "HandoffOutput",
    "Hashed",
    "HashedSequence",
    "History",
    "IcebergSource",
    "Id",
    "KafkaSource",
    "LabelJoin",
    "Layout",
    "LiveStage",
    "Numeric",
    "Output",
    "Pipeline",
    "RunOptions",
    "Source",
    "Stage",
    "TableOutput",
    "Vocabulary",
    "layout",
    "run_main",
]

install_excepthook()
