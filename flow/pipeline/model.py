"""A pipeline: sources, and stages that join and featurize them into a channel of training rows.

Everything is checked when the :class:`Pipeline` is built, before any engine starts: a stage that
names an unknown source, a join key one side lacks, a feature that reads a column no source or
join provides, two stages writing one channel. Each error names what is wrong and what exists.

Pipelines compose: :meth:`Pipeline.combine` puts several side by side as one, and
:meth:`Pipeline.renamed` renames sources (and the stages' references to them) or stages first,
where two of them use one name for different things.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Literal, TypeVar, overload

from flow.errors import ConfigError, HandoffError
from flow.handoff.shards import codec
from flow.pipeline.columns import outside_spark, stage_columns
from flow.pipeline.features import FeatureSpec, feature_inputs
from flow.pipeline.history import History
from flow.pipeline.schema import (
    FIELD_TYPES,
    Definition,
    Field,
    FieldType,
    check_identifier,
    check_interval,
    check_trigger,
    did_you_mean,
)
from flow.pipeline.sources import DeltaSource, KafkaSource, Source

__all__ = [
    "LABEL_STRATEGIES",
    "BackfillStage",
    "Derived",
    "Enrich",
    "HandoffOutput",
    "LabelJoin",
    "LiveStage",
    "Output",
    "Pipeline",
    "Stage",
    "TableOutput",
]


LABEL_STRATEGIES = ("window", "immediate")
"""When a live stage emits a labelled event: see :class:`LabelJoin`."""


@dataclass(frozen=True)
class LabelJoin(Definition):
    """Label each event by whether a matching event of ``source`` follows within ``window``.

    An event with a match at event time in ``[t, t + window]`` is a positive (``label`` 1);
    duplicate matches count once, and ``label_time`` holds the first match's time (null for
    negatives; in a stream, the first match to arrive, and of two in one micro-batch either).
    A stream cannot know an event is a negative before its window has passed, so a live stage
    chooses when to emit (``strategy``):

    * ``window``: each event once, when its label is final: a positive when its match arrives,
      a negative once the watermark passes the end of its window. Correct labels, but a row
      waits the window plus the watermark delay before it can be trained on.
    * ``immediate``: each event at once as a negative, and again as a positive (same key,
      ``label_time`` set) when its match arrives within the window. Rows are fresh, and the
      negatives are biased (every positive was first a "fake negative"): trainers correct for it
      (the fake-negative weighted loss; the channel records the strategy, see docs/trainers.md).

    A backfill sees every label already, so it always labels as ``window`` does.
    """

    source: str
    key: str
    window: str = "30 minutes"
    label: str = "label"
    label_time: str = "label_time"
    strategy: Literal["window", "immediate"] = "window"

    def __post_init__(self) -> None:
        check_identifier(self.key, "LabelJoin.key")
        check_identifier(self.label, "LabelJoin.label")
        check_identifier(self.label_time, "LabelJoin.label_time")
        check_interval(self.window, "LabelJoin.window")
        if self.strategy not in LABEL_STRATEGIES:
            raise ConfigError(
                f"LabelJoin.strategy={self.strategy!r} is not one of "
                f"{', '.join(LABEL_STRATEGIES)}{did_you_mean(self.strategy, LABEL_STRATEGIES)}"
            )

    def channel_labels(self, streaming: bool) -> dict[str, str]:
        """What a channel records about how its rows were labelled (ChannelMeta.labels)."""
        strategy = self.strategy if streaming else "window"
        # The key lets a trainer tie an immediate channel's positive to its impression.
        return {"strategy": strategy, "window": self.window, "label": self.label, "key": self.key}


@dataclass(frozen=True)
class Enrich(Definition):
    """Add ``columns`` of the dimension table ``source`` to each event, matched ``on`` a key.

    In a stream the table is read again every micro-batch, so updates to it are seen while the
    stream runs. Columns arrive as ``prefix + column``.
    """

    source: str
    on: str
    columns: tuple[str, ...]
    prefix: str = ""
    on_missing: Literal["keep", "dead_letter"] = "keep"
    """An event whose key the table does not hold (or a null key): ``keep`` it, its columns
    null (the features' null handling applies); or make it a ``dead_letter`` naming the key.
    Either way the misses are counted per enrichment (``missing.<source>`` in the report)."""

    def __post_init__(self) -> None:
        check_identifier(self.on, "Enrich.on")
        if not self.columns:
            raise ConfigError(f"Enrich({self.source!r}) takes no columns; list the ones to add")
        if self.on_missing not in ("keep", "dead_letter"):
            raise ConfigError(
                f"Enrich({self.source!r}): on_missing={self.on_missing!r}; use 'keep' or "
                "'dead_letter'"
            )


_NOT_DETERMINISTIC = re.compile(
    r"\b(rand|randn|random|uuid|shuffle|now|current_\w+|localtimestamp|"
    r"monotonically_increasing_id|spark_partition_id|input_file_\w+)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Derived(Definition):
    """A column computed by a Spark SQL expression over the stage's other columns, after the
    label join and the enrichments, before the features: ``Derived("label", "rating >= 4")``,
    ``Derived("hour", "hour(ts)", type="int")``.

    The result is cast to ``type``. A backfill and a stream compute it with the same
    expression, so it must be deterministic (no ``rand()``, no ``current_timestamp()``). The
    expression is resolved against the stage's declared columns when the stage starts, before
    it reads anything; a row it fails on (Spark's ANSI mode: ``try_cast``, ``try_divide`` return
    null instead) fails the batch. Later ones may use earlier ones.
    """

    name: str
    sql: str
    type: FieldType = "double"

    def __post_init__(self) -> None:
        check_identifier(self.name, "Derived.name")
        if not self.sql.strip():
            raise ConfigError(f"Derived({self.name!r}) has no expression; write e.g. 'hour(ts)'")
        if self.type not in FIELD_TYPES:
            raise ConfigError(
                f"Derived({self.name!r}): type {self.type!r} is unknown; types: "
                f"{', '.join(FIELD_TYPES)}{did_you_mean(self.type, FIELD_TYPES)}"
            )
        found = _NOT_DETERMINISTIC.search(self.sql)
        if found:
            raise ConfigError(
                f"Derived({self.name!r}, {self.sql!r}) uses {found.group(0)}, which gives other "
                "values in a backfill than in a stream; derive from the events' own columns "
                "(e.g. their event time)"
            )


@dataclass(frozen=True)
class BackfillStage(Definition):
    """A batch stage over table history; with ``fit`` it also fits the feature state."""

    name: str
    events: str
    features: FeatureSpec
    channel: str
    label: LabelJoin | None = None
    enrich: tuple[Enrich, ...] = ()
    derive: tuple[Derived, ...] = ()
    """Columns computed after the label join and the enrichments (see :class:`Derived`)."""
    history: tuple[History, ...] = ()
    """Point-in-time aggregates of a key's earlier events, computed from the events before the
    label join (see :class:`~flow.pipeline.history.History`); Derived columns may use them."""
    fit: bool = True
    max_dead_share: float = 0.05
    """The share of the events that may be dead letters (unparseable, failing their checks, a
    label or weight that cannot train, a dimension key not found with ``on_missing=
    "dead_letter"``). Above it the stage fails before it fits or writes anything, naming the
    top reason: a label of 1-5 makes most rows dead, and a run that trains on the rest is worse
    than no run. 1.0 turns the check off."""

    streaming = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_dead_share <= 1.0:
            raise ConfigError(
                f"BackfillStage({self.name!r}).max_dead_share={self.max_dead_share}: give a "
                "share in [0, 1] (0.05: at most 5 % of the events may be dead letters)"
            )


@dataclass(frozen=True)
class LiveStage(Definition):
    """A Structured Streaming stage over Kafka, featurized with a fitted state."""

    name: str
    events: str
    features: FeatureSpec
    channel: str
    label: LabelJoin | None = None
    enrich: tuple[Enrich, ...] = ()
    derive: tuple[Derived, ...] = ()
    """Columns computed after the label join and the enrichments (see :class:`Derived`)."""
    trigger: str = "10 seconds"
    """Micro-batch interval when running continuously (``--continuous``), as Spark's
    ``processingTime`` takes it: '10 seconds', '500 milliseconds', '1 minute'."""
    partitions: int | None = None
    """Shuffle and state-store partitions of a new checkpoint (each keeps a state store per
    stateful operator, committed every micro-batch). None: the cores of the cluster (local
    masters: of the machine) rather than Spark's 200. A checkpoint keeps the number it was
    made with (Spark reads it back from the offset log), so changing it needs a new one."""
    state_store: Literal["rocksdb", "memory"] = "rocksdb"
    """Where the label join's and the deduplication's state lives: ``rocksdb`` (Spark's RocksDB
    provider, with changelog checkpointing): native memory and local disk, so a label window
    of millions of pending impressions does not fill the JVM heap; ``memory`` (Spark's
    default, HDFS-backed): on the JVM heap, which a long window at a high rate exhausts (at
    2,000 impressions/s and a 30-minute window a 2 GB local driver failed after 7 minutes,
    docs/experiments/2026-11-23-freshness-and-demo.md). Like ``partitions``, a checkpoint
    keeps the provider it was made with."""

    streaming = True

    def __post_init__(self) -> None:
        check_trigger(self.trigger, f"LiveStage({self.name!r}).trigger")
        if self.state_store not in ("rocksdb", "memory"):
            raise ConfigError(
                f"LiveStage({self.name!r}).state_store={self.state_store!r}: give 'rocksdb' "
                "(native memory and disk) or 'memory' (the JVM heap)"
            )
        if self.partitions is not None and self.partitions < 1:
            raise ConfigError(
                f"LiveStage({self.name!r}).partitions={self.partitions}: give a positive number "
                "of partitions, or None for the cluster's cores"
            )


Stage = BackfillStage | LiveStage
StageT = TypeVar("StageT", bound=Stage)


@dataclass(frozen=True)
class HandoffOutput(Definition):
    """Training rows go to the handoff: one channel per stage, read by the trainers.

    The location is ``$FLOW_HANDOFF/<namespace>`` unless ``location`` says otherwise.
    """

    location: str | None = None
    num_buckets: int = 64
    """Buckets rows are hashed into; a trainer's world size must divide it."""
    compression: Literal["lz4", "zstd"] | None = "lz4"
    compression_level: int | None = None
    """None: LZ4 at acceleration 2. Lower is faster to write and read, and bigger: LZ4 -8 is
    ~40 % less CPU to write and ~25 % less to read for ~18 % more bytes (docs/handoff.md)."""
    shuffle_key: str | None = None
    """Hash this passthrough column into buckets (rows with one key stay together); default: a
    random value, which spreads rows evenly."""
    max_unconsumed_bytes: int | None = None
    """Backpressure: a stage waits while consumers have more than this left to read."""
    max_rows_per_shard: int = 256_000

    def __post_init__(self) -> None:
        if not 1 <= self.num_buckets <= 65536:
            raise ConfigError(f"HandoffOutput.num_buckets={self.num_buckets}: use 1..65536")
        if self.max_rows_per_shard < 1:
            raise ConfigError("HandoffOutput.max_rows_per_shard must be at least 1")
        try:
            codec(self.compression, self.compression_level)
        except HandoffError as exc:
            raise ConfigError(f"HandoffOutput: {exc}") from exc


@dataclass(frozen=True)
class TableOutput(Definition):
    """Training rows go to the Iceberg table ``<namespace>.training_<channel>`` instead."""


Output = HandoffOutput | TableOutput


def _names(mapping: Mapping[str, object]) -> str:
    return ", ".join(sorted(mapping)) or "none"


def _with_sources(stage: StageT, names: Mapping[str, str]) -> StageT:
    """``stage`` reading the sources ``names`` renames (old -> new) under their new names."""
    label = stage.label and replace(
        stage.label, source=names.get(stage.label.source, stage.label.source)
    )
    return replace(
        stage,
        events=names.get(stage.events, stage.events),
        label=label,
        enrich=tuple(replace(e, source=names.get(e.source, e.source)) for e in stage.enrich),
    )


def _check_renames(kind: str, renames: Mapping[str, str], existing: list[str], owner: str) -> None:
    for old in renames:
        if old not in existing:
            raise ConfigError(
                f"pipeline {owner!r}: cannot rename {kind} {old!r}, which it does not have; "
                f"{kind}s: {', '.join(existing) or 'none'}{did_you_mean(old, existing)}"
            )
    after = [renames.get(n, n) for n in existing]
    for old, new in renames.items():
        if after.count(new) > 1:
            raise ConfigError(
                f"pipeline {owner!r}: renaming {kind} {old!r} to {new!r} clashes with its "
                f"{kind} {new!r}; choose another name"
            )


def _history_names(stage: Stage) -> tuple[str, ...]:
    return tuple(h.name for h in stage.history) if isinstance(stage, BackfillStage) else ()


def feature_columns(spec: FeatureSpec) -> set[str]:
    """The columns ``spec``'s features read."""
    return {c for f in spec.features for c in feature_inputs(f)}


@dataclass(frozen=True)
class Pipeline(Definition):
    """Sources and the stages that turn them into training rows."""

    name: str
    namespace: str
    """Iceberg namespace of the pipeline's own tables (dead letters, training rows)."""
    sources: Mapping[str, Source]
    stages: tuple[Stage, ...]
    output: Output = field(default_factory=HandoffOutput)
    """Where training rows go: the handoff (default) or Iceberg tables."""
    columns: dict[str, dict[str, Field]] = field(init=False, repr=False, compare=False)
    """Per stage: the columns available to its features (filled in by validation)."""
    outside_spark: dict[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)
    """Per stage: why its features cannot be applied outside Spark (flow.transform), found when
    the pipeline is built; empty where they can. A served model or the consistency check of
    such a stage says these reasons rather than computing other values than Spark does."""
    spark_only: dict[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)
    """Per stage: the Derived and History columns its features read. Spark computes them (SQL
    expressions, windows over a key's history), the Python transform does not: a model serving
    raw events takes these columns as inputs, computed by the caller (the consistency check
    takes them from Spark)."""

    def __post_init__(self) -> None:
        check_identifier(self.name, "Pipeline.name")
        check_identifier(self.namespace, "Pipeline.namespace")
        if not self.stages:
            raise ConfigError(f"pipeline {self.name!r} has no stages")
        for source in self.sources:
            check_identifier(source, "source name")
        seen: set[str] = set()
        channels: dict[str, str] = {}
        columns = {}
        for stage in self.stages:
            check_identifier(stage.name, "stage name")
            check_identifier(stage.channel, f"stage {stage.name!r} channel")
            if stage.name in seen:
                raise ConfigError(f"pipeline {self.name!r}: two stages are named {stage.name!r}")
            seen.add(stage.name)
            if stage.channel in channels:
                raise ConfigError(
                    f"stages {channels[stage.channel]!r} and {stage.name!r} both write channel "
                    f"{stage.channel!r}; give each stage its own channel"
                )
            channels[stage.channel] = stage.name
            columns[stage.name] = stage_columns(stage, self.source)
            key = self.output.shuffle_key if isinstance(self.output, HandoffOutput) else None
            passthrough = stage.features.passthrough
            if key is not None and key not in passthrough:
                raise ConfigError(
                    f"HandoffOutput.shuffle_key={key!r} is not a passthrough column of stage "
                    f"{stage.name!r} (passthrough: {', '.join(passthrough) or 'none'})"
                    f"{did_you_mean(key, passthrough)}"
                )
        object.__setattr__(self, "columns", columns)
        portable = {
            stage.name: tuple(outside_spark(stage.features, columns[stage.name]))
            for stage in self.stages
        }
        object.__setattr__(self, "outside_spark", portable)
        derived_read = {
            stage.name: tuple(
                name
                for name in (*_history_names(stage), *(d.name for d in stage.derive))
                if name in feature_columns(stage.features)
            )
            for stage in self.stages
        }
        object.__setattr__(self, "spark_only", derived_read)

    @overload
    def stage(self, name: str) -> Stage: ...
    @overload
    def stage(self, name: str, kind: type[StageT]) -> StageT: ...
    def stage(self, name: str, kind: type[StageT] | None = None) -> Stage:
        """The stage called ``name``; with ``kind`` (``LiveStage``, ``BackfillStage``) typed as
        one, or a :class:`ConfigError` if it is of another kind."""
        for stage in self.stages:
            if stage.name == name:
                if kind is not None and not isinstance(stage, kind):
                    raise ConfigError(
                        f"pipeline {self.name!r}: stage {name!r} is a {type(stage).__name__}, "
                        f"not a {kind.__name__}"
                    )
                return stage
        raise ConfigError(
            f"pipeline {self.name!r} has no stage {name!r}; stages: "
            f"{', '.join(s.name for s in self.stages)}"
            f"{did_you_mean(name, (s.name for s in self.stages))}"
        )

    def renamed(
        self,
        *,
        sources: Mapping[str, str] | None = None,
        stages: Mapping[str, str] | None = None,
    ) -> Pipeline:
        """A copy with ``sources`` renamed (old name -> new), every stage's events, label join
        and enrichment following them, and ``stages`` renamed; validated like any pipeline.

        ``ctr_backfill().renamed(sources={"impressions": "history"})`` reads its events from
        a source called ``history``, which can then sit beside a streaming ``impressions``.
        """
        source_names = dict(sources or {})
        stage_names = dict(stages or {})
        _check_renames("source", source_names, list(self.sources), self.name)
        _check_renames("stage", stage_names, [s.name for s in self.stages], self.name)
        return replace(
            self,
            sources={source_names.get(k, k): v for k, v in self.sources.items()},
            stages=tuple(
                replace(_with_sources(s, source_names), name=stage_names.get(s.name, s.name))
                for s in self.stages
            ),
        )

    def holdout(self, stage: str, *, after: datetime, channel: str = "holdout") -> Pipeline:
        """A time split: backfill ``stage`` learns from its events before ``after``, and a
        stage ``<stage>_holdout`` writes those from ``after`` on to ``channel`` with the state
        ``stage`` fits, to evaluate on (``--eval-channel holdout``); see flow.pipeline.splits."""
        from flow.pipeline.splits import time_holdout

        return time_holdout(self, stage, after, channel)

    @classmethod
    def combine(
        cls,
        name: str,
        *parts: Pipeline,
        namespace: str | None = None,
        output: Output | None = None,
    ) -> Pipeline:
        """One pipeline named ``name`` of ``parts``: their sources side by side, their stages in
        order; validated like any pipeline.

        A source that several parts define identically (a shared dimension table) is one
        source. A source name two parts use for different sources, or a stage name both use,
        is an error: rename it in one part first with :meth:`renamed`. ``namespace`` and
        ``output`` default to the parts' own, which must then agree.
        """
        if not parts:
            raise ConfigError(f"Pipeline.combine({name!r}) got no pipelines to combine")
        if namespace is None:
            namespaces = sorted({p.namespace for p in parts})
            if len(namespaces) > 1:
                raise ConfigError(
                    f"Pipeline.combine({name!r}): the pipelines use namespaces "
                    f"{', '.join(namespaces)}; choose one with namespace=..."
                )
            namespace = namespaces[0]
        if output is None:
            output = parts[0].output
            for part in parts[1:]:
                if part.output != output:
                    raise ConfigError(
                        f"Pipeline.combine({name!r}): {parts[0].name!r} and {part.name!r} write "
                        f"to different outputs ({output} and {part.output}); choose one with "
                        "output=..."
                    )
        sources: dict[str, Source] = {}
        defined_by: dict[str, str] = {}
        stages: dict[str, str] = {}
        for part in parts:
            for source_name, source in part.sources.items():
                if source_name in sources and sources[source_name] != source:
                    raise ConfigError(
                        f"Pipeline.combine({name!r}): {defined_by[source_name]!r} and "
                        f"{part.name!r} both have a source named {source_name!r}, and they "
                        f"differ; rename it in one of them first, e.g. "
                        f"{part.name}.renamed(sources={{{source_name!r}: "
                        f"{part.name + '_' + source_name!r}}})"
                    )
                sources.setdefault(source_name, source)
                defined_by.setdefault(source_name, part.name)
            for stage in part.stages:
                if stage.name in stages:
                    raise ConfigError(
                        f"Pipeline.combine({name!r}): {stages[stage.name]!r} and {part.name!r} "
                        f"both have a stage named {stage.name!r}; rename it in one of them first, "
                        f"e.g. {part.name}.renamed(stages={{{stage.name!r}: "
                        f"{part.name + '_' + stage.name!r}}})"
                    )
                stages[stage.name] = part.name
        return cls(
            name=name,
            namespace=namespace,
            sources=sources,
            stages=tuple(stage for part in parts for stage in part.stages),
            output=output,
        )

    def connectors(self) -> frozenset[str]:
        """The Spark connectors its sources need beyond Iceberg's (flow.engine.CONNECTORS), so
        that ``flow run`` starts its driver without the others' jars."""
        kinds = {"kafka": KafkaSource, "delta": DeltaSource}
        used = list(self.sources.values())
        return frozenset(
            name for name, kind in kinds.items() if any(isinstance(s, kind) for s in used)
        )

    def source(self, name: str, *, used_by: str) -> Source:
        try:
            return self.sources[name]
        except KeyError:
            raise ConfigError(
                f"{used_by} names source {name!r}, which the pipeline does not define; "
                f"sources: {_names(self.sources)}{did_you_mean(name, self.sources)}"
            ) from None
