"""Pipeline definitions are validated when built: every mistake names what to change."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from flow.errors import ConfigError
from flow.pipeline import (
    BackfillStage,
    Bucketized,
    Cross,
    Derived,
    Enrich,
    FeatureSpec,
    Field,
    HandoffOutput,
    Hashed,
    HashedSequence,
    IcebergSource,
    Id,
    KafkaSource,
    LabelJoin,
    LiveStage,
    Numeric,
    Pipeline,
    TableOutput,
    Vocabulary,
    run_main,
)
from flow.pipeline.run import parse_run_args
from pipelines.ctr import ctr_features
from pipelines.ctr_backfill import ctr_backfill
from pipelines.ctr_streaming import ctr_streaming

EVENTS = (
    Field("id", "string", required=True),
    Field("user_id", "long", required=True),
    Field("ts", "timestamp", required=True),
    Field("price", "double"),
    Field("tags", "array<string>"),
)
CLICKS = (Field("id", "string", required=True), Field("ts", "timestamp", required=True))
USERS = (Field("user_id", "long", required=True), Field("country", "string"))


def spec(*features: object, **kwargs: object) -> FeatureSpec:
    chosen = features or (Hashed("user_id", buckets=100),)
    return FeatureSpec("s", tuple(chosen), **kwargs)  # type: ignore[arg-type]


def pipeline(*, stage: object | None = None, **sources: object) -> Pipeline:
    all_sources = {
        "events": KafkaSource("t.events", EVENTS, event_time="ts"),
        "clicks": KafkaSource("t.clicks", CLICKS, event_time="ts"),
        "users": IcebergSource("ns.users", USERS),
        **sources,
    }
    chosen = stage or LiveStage(
        "live",
        events="events",
        label=LabelJoin("clicks", key="id"),
        enrich=(Enrich("users", on="user_id", columns=("country",), prefix="user_"),),
        features=spec(Vocabulary("user_country"), Numeric("price"), HashedSequence("tags", 4, 50)),
        channel="live",
    )
    return Pipeline("p", "ns", all_sources, (chosen,))  # type: ignore[arg-type]


def test_a_valid_pipeline_knows_the_columns_each_stage_sees() -> None:
    built = pipeline()
    assert set(built.columns["live"]) == {
        "id",
        "user_id",
        "ts",
        "price",
        "tags",
        "label",
        "label_time",
        "user_country",
        "produced_at",  # every stage's: the Kafka record's time (null for table rows)
    }


def test_an_id_feature_passes_an_integer_column_through() -> None:
    built = _live(features=spec(Id("user_id"), Numeric("price")))()
    assert built.stages[0].features.of_kind("id") == [Id("user_id")]


def test_the_example_pipelines_are_valid_and_share_one_feature_spec() -> None:
    backfill, streaming = ctr_backfill(), ctr_streaming()
    assert backfill.stages[0].features == streaming.stages[0].features
    assert backfill.stages[0].features.fingerprint == streaming.stages[0].features.fingerprint


def _live(**changes: Any) -> Callable[[], Pipeline]:
    base = pipeline().stages[0]
    return lambda: pipeline(stage=dataclasses.replace(base, **changes))


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            _live(events="impressions"),
            r"names source 'impressions'.*sources: clicks, events, users",
        ),
        (
            _live(features=spec(Numeric("age"))),
            r"feature 'age' reads column 'age'.*available: .*user_country",
        ),
        (
            _live(enrich=(Enrich("users", on="user_id", columns=("city",)),)),
            r"enrich source 'users' has no column 'city'; its columns: country, user_id",
        ),
        (
            _live(enrich=(Enrich("users", on="user_id", columns=("user_id",)),)),
            r"adds column 'user_id', which 'events' already has; set a prefix",
        ),
        (
            _live(label=LabelJoin("clicks", key="user_id")),
            r"label join key 'user_id' is not a column of the label source",
        ),
        (_live(label=LabelJoin("users", key="user_id")), r"must be a Kafka topic for a stream"),
        (_live(features=spec(Numeric("id"))), r"feature 'id' needs a number; 'id' is string"),
        (
            _live(features=spec(Hashed("tags", 10))),
            r"reads array column 'tags'; use HashedSequence",
        ),
        (
            _live(features=spec(HashedSequence("price", 4, 10))),
            r"needs an array; 'price' is double",
        ),
        (
            _live(features=spec(Id("id"))),
            r"feature 'id' is an Id, which needs an integer column; 'id' is string",
        ),
        (_live(features=spec(Id("tags"))), r"is an Id, which needs an integer column"),
        (_live(features=spec(weight="country")), r"the weight reads column 'country'"),
        (_live(features=spec(passthrough=("nope",))), r"passthrough reads column 'nope'"),
        (_live(label=None), r"the label reads column 'label', which does not exist here"),
    ],
)
def test_mistakes_in_a_stage_name_what_is_wrong_and_what_exists(
    build: Callable[[], Pipeline], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        build()


def test_a_handoff_output_with_a_bad_codec_level_is_refused() -> None:
    assert HandoffOutput(compression="zstd", compression_level=9).compression_level == 9
    with pytest.raises(ConfigError, match=r"HandoffOutput: compression_level=40 is out of range"):
        HandoffOutput(compression_level=40)


def test_stage_kinds_match_their_sources() -> None:
    table_events = IcebergSource("ns.events", EVENTS, event_time="ts")
    live_on_table = LiveStage("s", events="hist", features=spec(), channel="c")
    with pytest.raises(ConfigError, match="LiveStage: its events must be a KafkaSource"):
        pipeline(stage=live_on_table, hist=table_events)
    backfill_on_kafka = BackfillStage("s", events="events", features=spec(), channel="c")
    with pytest.raises(ConfigError, match="BackfillStage: its events must be an Iceberg or Delta"):
        pipeline(stage=backfill_on_kafka)


def test_two_stages_cannot_share_a_channel_or_a_name() -> None:
    sources = {"hist": IcebergSource("ns.h", EVENTS[:3], event_time="ts")}
    features = spec(passthrough=(), label="user_id")
    a = BackfillStage("a", events="hist", features=features, channel="c")
    with pytest.raises(ConfigError, match="both write channel 'c'"):
        Pipeline("p", "ns", sources, (a, dataclasses.replace(a, name="b")))
    with pytest.raises(ConfigError, match="two stages are named 'a'"):
        Pipeline("p", "ns", sources, (a, dataclasses.replace(a, channel="d")))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Field("Bad-Name", "string"), "use lower-case letters"),
        (lambda: Field("x", "decimal"), "type 'decimal' is unknown"),  # type: ignore[arg-type]
        (lambda: Field("x", "string", min=1), "min/max need a numeric type"),
        (lambda: Field("x", "long", min=5, max=1), "min=5 is above max=1"),
        (lambda: Field("x", "long", allowed=("a",)), "allowed values need type string"),
        (lambda: KafkaSource("bad topic!", EVENTS, event_time="ts"), "not a legal Kafka topic"),
        (lambda: KafkaSource("t", EVENTS, event_time="price"), "event_time 'price' is double"),
        (
            lambda: KafkaSource("t", EVENTS, event_time="when"),
            "event_time 'when' is not a declared",
        ),
        (lambda: KafkaSource("t", EVENTS, event_time="ts", watermark="10m"), "is not an interval"),
        (lambda: IcebergSource("users", USERS), "namespace.table"),
        (lambda: IcebergSource("ns.u", USERS, snapshot_id=1, since_snapshot=0), "choose one of"),
        (lambda: IcebergSource("ns.u", (*USERS, USERS[0])), "declares user_id more than once"),
        (lambda: Vocabulary("c", max_size=10**6), "use Hashed for high-cardinality"),
        (lambda: Hashed("c", buckets=1), "buckets=1 must be in 2"),
        (lambda: Cross(("a",), 10), "cross at least two columns"),
        (lambda: Numeric("x", clip=(5, 1)), "needs low < high"),
        (lambda: Bucketized("x", buckets=5000), "not in 2..1000"),
        (lambda: spec(Hashed("a", 10), Hashed("a", 20)), "feature name\\(s\\) a used twice"),
        (lambda: spec(weight=0.0), "weight=0.0 must be positive"),
        (lambda: LabelJoin("c", key="k", window="forever"), "is not an interval"),
    ],
)
def test_building_blocks_reject_bad_values(make: Callable[[], object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


def test_unknown_keyword_arguments_are_refused_not_ignored() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^LabelJoin\(windw='5 minutes'\): LabelJoin has no field 'windw'; its fields: "
        r"source, key, window, label, label_time, strategy; did you mean 'window'\?$",
    ):
        LabelJoin("c", key="k", windw="5 minutes")  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        # What mypy refuses too: a definition file need not be type-checked to be told.
        (
            lambda: LabelJoin("c"),  # type: ignore[call-arg]
            r"^LabelJoin needs key; give a value for each$",
        ),
        (
            lambda: Hashed("c", 10, "n", 4),  # type: ignore[call-arg]
            r"^Hashed takes at most 3 positional arguments \(column, buckets, name\), not 4",
        ),
        (
            lambda: Hashed("c", column="d"),  # type: ignore[call-arg,misc]
            r"'column' is given twice",
        ),
        (  # Pipeline.columns is filled in by validation, not given.
            lambda: Pipeline("p", "ns", {}, (), columns={}),  # type: ignore[call-arg]
            "has no field 'columns'",
        ),
        (
            lambda: dataclasses.replace(HandoffOutput(), num_bucket=8),  # type: ignore[call-arg]
            r"HandoffOutput has no field 'num_bucket'.*did you mean 'num_buckets'\?",
        ),
    ],
)
def test_missing_and_extra_arguments_name_the_class_and_the_field(
    make: Callable[[], object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


def test_definitions_still_pickle_and_copy() -> None:
    # Spark ships definitions to executors by pickling: that must not go through the check.
    import copy
    import pickle

    built = pipeline()
    assert pickle.loads(pickle.dumps(built.stages[0])) == built.stages[0]
    assert copy.deepcopy(built.sources) == built.sources


def test_the_ctr_spec_keeps_the_fingerprint_its_fitted_states_were_saved_under() -> None:
    # A rename must not orphan states (Sequence -> HashedSequence kept "b4110a52becf4d35");
    # new passthrough columns (p_click, produced_at) changed the rows, and so this value.
    assert ctr_features().fingerprint == "9133a6feea66abe3"


def test_the_spec_fingerprint_follows_every_change() -> None:
    base = spec(Vocabulary("c"), Numeric("x"))
    assert base.fingerprint == spec(Vocabulary("c"), Numeric("x")).fingerprint
    assert base.fingerprint != spec(Vocabulary("c", min_frequency=2), Numeric("x")).fingerprint
    assert base.fingerprint != spec(Vocabulary("c"), Numeric("x", log=True)).fingerprint


def test_run_options_choose_stages_and_mode() -> None:
    options = parse_run_args(
        ["--stage", "live", "--continuous", "--duration", "30"], ["bf", "live"]
    )
    assert options.stages == ("live",)
    assert options.mode == "continuous"
    assert options.duration_s == 30
    with pytest.raises(SystemExit):
        parse_run_args(["--stage", "nope"], ["bf", "live"])
    with pytest.raises(ConfigError, match="--duration applies to --continuous"):
        parse_run_args(["--duration", "5"], ["bf"])


def test_run_main_names_a_missing_engine_and_exits_non_zero(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        run_main(pipeline(), engine="nope", argv=["--stage", "live"])
    assert exited.value.code == 1
    assert "no primus_flow.engines plugin 'nope'" in capsys.readouterr().err


def test_a_stage_is_found_by_name_and_typed_by_its_kind() -> None:
    built = pipeline()
    live: LiveStage = built.stage("live", LiveStage)
    assert live.trigger == "10 seconds"
    assert built.stage("live") is live
    with pytest.raises(ConfigError, match=r"stage 'live' is a LiveStage, not a BackfillStage"):
        built.stage("live", BackfillStage)
    with pytest.raises(ConfigError, match=r"has no stage 'backfill'; stages: live"):
        built.stage("backfill", BackfillStage)


@pytest.mark.parametrize(
    "trigger",
    ["10 seconds", "1 second", "2 seconds", "500 milliseconds", "1 minute", "1.5 seconds",
     "1 minute 30 seconds", "2 hours", "10 Seconds", "0 seconds"],
)  # fmt: skip
def test_a_live_trigger_spark_accepts_is_accepted(trigger: str) -> None:
    assert LiveStage("s", events="e", features=spec(), channel="c", trigger=trigger)


def test_a_live_stage_keeps_its_state_in_rocksdb_unless_told_and_names_the_choices() -> None:
    assert LiveStage("s", events="e", features=spec(), channel="c").state_store == "rocksdb"
    heap = LiveStage("s", events="e", features=spec(), channel="c", state_store="memory")
    assert heap.state_store == "memory"
    with pytest.raises(ConfigError, match=r"state_store='disk'.*'rocksdb'.*'memory'"):
        LiveStage("s", events="e", features=spec(), channel="c", state_store="disk")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("trigger", "message"),
    [
        ("10s", r"'10s' is not a micro-batch interval Spark accepts; write e.g. '10 sec"),
        ("10", r"not a micro-batch interval"),
        ("-5 seconds", r"no months, years or negative values"),
        ("1 month", r"no months, years or negative values"),
        ("1.5 minutes", r"not a micro-batch interval"),
        ("once", r"a run without --continuous already processes what has arrived and stops"),
        ("available-now", r"the trigger is the micro-batch interval of --continuous runs"),
    ],
)
def test_a_live_trigger_spark_would_refuse_at_run_time_is_refused_when_built(
    trigger: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=rf"LiveStage\('s'\)\.trigger=.*{message}"):
        LiveStage("s", events="e", features=spec(), channel="c", trigger=trigger)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (_live(events="event"), r"sources: clicks, events, users; did you mean 'events'\?"),
        (
            _live(features=spec(Numeric("prise"))),
            r"reads column 'prise', which does not exist here; available: .*; did you mean 'price'",
        ),
        (
            _live(enrich=(Enrich("users", on="user_id", columns=("county",)),)),
            r"has no column 'county'; its columns: country, user_id; did you mean 'country'\?",
        ),
        (
            _live(label=LabelJoin("clicks", key="idd")),
            r"key 'idd' is not a column of the events .*; did you mean 'id'\?",
        ),
        (
            lambda: pipeline().stage("lvie"),
            r"has no stage 'lvie'; stages: live; did you mean 'live'",
        ),
        (lambda: Field("x", "strng"), r"types: .*; did you mean 'string'\?"),  # type: ignore[arg-type]
        (
            lambda: KafkaSource("t", EVENTS, event_time="tss"),
            r"event_time 'tss' is not a declared column; .*; did you mean 'ts'\?",
        ),
    ],
)
def test_an_unknown_name_suggests_the_closest_known_one(
    build: Callable[[], object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        build()


def test_an_unknown_name_far_from_every_known_one_suggests_nothing() -> None:
    with pytest.raises(ConfigError) as refused:
        _live(events="zzz")()
    assert "did you mean" not in str(refused.value)


def test_an_unknown_stage_on_the_command_line_suggests_the_closest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse_run_args(["--stage", "backfil"], ["backfill", "live"])
    assert (
        "invalid choice: 'backfil' (choose from backfill, live); did you mean 'backfill'?"
        in capsys.readouterr().err
    )


def _history(name: str = "hist") -> Pipeline:
    sources = {
        "events": IcebergSource("ns.events", EVENTS, event_time="ts"),
        "clicks": IcebergSource("ns.clicks", CLICKS, event_time="ts"),
        "users": IcebergSource("ns.users", USERS),
    }
    stage = BackfillStage(
        "backfill",
        events="events",
        label=LabelJoin("clicks", key="id"),
        enrich=(Enrich("users", on="user_id", columns=("country",), prefix="user_"),),
        features=spec(Vocabulary("user_country")),
        channel="backfill",
    )
    return Pipeline(name, "ns", sources, (stage,))


def test_renaming_a_source_renames_every_reference_to_it() -> None:
    renamed = _history().renamed(sources={"events": "history", "users": "people"})
    assert list(renamed.sources) == ["history", "clicks", "people"]
    stage = renamed.stage("backfill", BackfillStage)
    assert stage.events == "history"
    assert stage.label == LabelJoin("clicks", key="id")
    assert [e.source for e in stage.enrich] == ["people"]
    assert renamed.columns == _history().columns
    assert _history().renamed(stages={"backfill": "bf"}).stage("bf").channel == "backfill"


@pytest.mark.parametrize(
    ("renames", "message"),
    [
        ({"sources": {"event": "x"}}, r"cannot rename source 'event'.*did you mean 'events'\?"),
        ({"sources": {"events": "clicks"}}, r"renaming source 'events' to 'clicks' clashes"),
        ({"sources": {"events": "Bad"}}, r"source name='Bad': use lower-case"),
        ({"stages": {"bf": "x"}}, r"cannot rename stage 'bf'.*stages: backfill"),
    ],
)
def test_a_rename_that_cannot_work_is_refused(renames: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _history().renamed(**renames)


def test_combined_pipelines_share_identical_sources_and_keep_stage_order() -> None:
    history = _history().renamed(sources={"events": "history", "clicks": "history_clicks"})
    combined = Pipeline.combine("both", history, pipeline())
    assert [s.name for s in combined.stages] == ["backfill", "live"]
    assert list(combined.sources) == ["history", "history_clicks", "users", "events", "clicks"]
    assert combined.namespace == "ns"
    assert combined.columns["live"] == pipeline().columns["live"]


def test_combining_pipelines_that_clash_says_how_to_rename() -> None:
    # "events" (and "clicks") is a table in one and a topic in the other.
    with pytest.raises(
        ConfigError,
        match=r"'hist' and 'p' both have a source named 'events', and they differ; rename it in "
        r"one of them first, e.g. p.renamed\(sources=\{'events': 'p_events'\}\)",
    ):
        Pipeline.combine("both", _history(), pipeline())
    with pytest.raises(
        ConfigError,
        match=r"'hist' and 'other' both have a stage named 'backfill'; rename it in one of them "
        r"first, e.g. other.renamed\(stages=\{'backfill': 'other_backfill'\}\)",
    ):
        Pipeline.combine("both", _history(), _history("other"))
    with pytest.raises(ConfigError, match=r"both write channel 'backfill'"):
        Pipeline.combine("both", _history(), _history("other").renamed(stages={"backfill": "b2"}))
    elsewhere = dataclasses.replace(pipeline(), namespace="other")
    with pytest.raises(ConfigError, match=r"namespaces ns, other; choose one with namespace="):
        Pipeline.combine(
            "both", _history().renamed(sources={"events": "e", "clicks": "c"}), elsewhere
        )
    to_tables = dataclasses.replace(pipeline(), output=TableOutput())
    with pytest.raises(ConfigError, match=r"'hist' and 'p' write to different outputs"):
        Pipeline.combine(
            "both", _history().renamed(sources={"events": "e", "clicks": "c"}), to_tables
        )
    with pytest.raises(ConfigError, match=r"got no pipelines to combine"):
        Pipeline.combine("none")


def test_a_label_strategy_is_checked_and_recorded_for_the_channel() -> None:
    with pytest.raises(ConfigError, match=r"strategy='imediate'.*did you mean 'immediate'"):
        LabelJoin("clicks", key="id", strategy="imediate")  # type: ignore[arg-type]
    fresh = LabelJoin("clicks", key="id", window="5 minutes", strategy="immediate")
    assert fresh.channel_labels(streaming=True) == {
        "strategy": "immediate",
        "window": "5 minutes",
        "label": "label",
        "key": "id",
    }
    # A backfill knows every label: its rows are final whatever the live stage emits.
    assert fresh.channel_labels(streaming=False)["strategy"] == "window"


def _spec(**changes: object) -> FeatureSpec:
    base: dict[str, object] = {
        "name": "rows",
        "features": (Hashed("id", buckets=8),),
        "label": "rating",
        "weight": "w",
    }
    return FeatureSpec(**(base | changes))  # type: ignore[arg-type]


def test_label_and_weight_settings_are_checked_when_built() -> None:
    with pytest.raises(ConfigError, match="labels='stars'; use 'binary'"):
        _spec(labels="stars")
    with pytest.raises(ConfigError, match="weight_range is for a weight column"):
        _spec(weight=2.0, weight_range=(1, 3))
    with pytest.raises(ConfigError, match=r"weight_range=\(3, 1\); give"):
        _spec(weight_range=(3, 1))
    assert _spec().fingerprint == _spec(labels="binary").fingerprint  # old states still fit
    assert _spec().fingerprint != _spec(labels="probability").fingerprint


def _with_stage(pipeline: Pipeline, **changes: Any) -> Pipeline:
    return dataclasses.replace(
        pipeline, stages=tuple(dataclasses.replace(s, **changes) for s in pipeline.stages)
    )


def test_derived_columns_feed_features_and_are_checked_when_built() -> None:
    pipeline = ctr_backfill()
    spec = pipeline.stages[0].features
    hourly = dataclasses.replace(spec, features=(*spec.features, Numeric("hour")))
    built = _with_stage(
        pipeline, derive=(Derived("hour", "hour(ts)", type="int"),), features=hourly
    )
    assert built.columns["backfill"]["hour"] == Field("hour", "int")
    with pytest.raises(ConfigError, match="reads column 'hour', which does not exist here"):
        _with_stage(pipeline, features=hourly)  # a feature of a column no one derives
    with pytest.raises(ConfigError, match=r"Derived\('label'\) adds column 'label', which"):
        _with_stage(pipeline, derive=(Derived("label", "position <= 2"),))
    with pytest.raises(ConfigError, match="uses current_timestamp, which gives other values"):
        Derived("age_s", "unix_seconds(current_timestamp()) - unix_seconds(ts)")
    with pytest.raises(ConfigError, match=r"type 'integer' is unknown.*did you mean"):
        Derived("hour", "hour(ts)", type="integer")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="has no expression"):
        Derived("hour", " ")


def test_an_epoch_unit_is_for_timestamps_only() -> None:
    assert Field("ts", "timestamp", epoch="ms").epoch == "ms"
    with pytest.raises(ConfigError, match="epoch needs type timestamp, not long"):
        Field("ts", "long", epoch="s")
    with pytest.raises(ConfigError, match="epoch='seconds'; use 's', 'ms' or 'us'"):
        Field("ts", "timestamp", epoch="seconds")  # type: ignore[arg-type]


def test_a_time_split_in_one_line() -> None:
    at = datetime(2026, 1, 5, tzinfo=UTC)
    split = ctr_backfill().holdout("backfill", after=at)
    assert [(s.name, s.channel) for s in split.stages] == [
        ("backfill", "backfill"),
        ("backfill_holdout", "holdout"),
    ]
    train = split.stage("backfill", BackfillStage)
    held = split.stage("backfill_holdout", BackfillStage)
    before, after = split.sources[train.events], split.sources[held.events]
    assert isinstance(before, IcebergSource)
    assert isinstance(after, IcebergSource)
    assert (before.end, after.start, after.table) == (at, at, before.table)
    assert not held.fit
    assert (held.features, held.label, held.enrich) == (train.features, train.label, train.enrich)
    with pytest.raises(ConfigError, match="has no time zone"):
        ctr_backfill().holdout("backfill", after=datetime(2026, 1, 5))
    with pytest.raises(ConfigError, match="is a LiveStage"):
        ctr_streaming().holdout("live", after=at)
    with pytest.raises(ConfigError, match=r"outside the events' range"):
        split.holdout("backfill", after=datetime(2026, 2, 1, tzinfo=UTC))


def test_a_pipeline_names_the_connectors_its_sources_need_beyond_icebergs() -> None:
    from flow.pipeline import DeltaSource
    from pipelines.ctr import USER_COLUMNS

    assert ctr_backfill().connectors() == frozenset()
    assert ctr_streaming().connectors() == {"kafka"}
    users = DeltaSource("users", USER_COLUMNS)
    with_delta = dataclasses.replace(
        ctr_streaming(), sources={**ctr_streaming().sources, "users": users}
    )
    assert with_delta.connectors() == {"kafka", "delta"}


def test_what_cannot_run_outside_spark_is_known_when_the_pipeline_is_built() -> None:
    pipeline = ctr_backfill()
    assert pipeline.outside_spark == {"backfill": ()}
    assert pipeline.spark_only == {"backfill": ()}
    spec = pipeline.stages[0].features
    changed = dataclasses.replace(
        spec,
        features=(*spec.features, Numeric("hour"), Hashed("item_price", buckets=8, name="p")),
    )
    built = _with_stage(
        pipeline, derive=(Derived("hour", "hour(ts)", type="int"),), features=changed
    )
    assert built.spark_only == {"backfill": ("hour",)}  # a server passes 'hour' itself
    (reason,) = built.outside_spark["backfill"]
    assert "feature 'p' hashes or looks up 'item_price', a double column" in reason
