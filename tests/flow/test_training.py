"""The trainer's one configuration: a generated command line, JSON files, namespace defaults."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.storage import namespace_locations
from flow.training import (
    EmbeddingConfig,
    ModelConfig,
    OptimConfig,
    TrainConfig,
    load_config,
    location_settings,
    parse_args,
    save_config,
)
from tests.support import stack_env_for


def test_short_flags_and_the_generated_long_ones_give_the_same_config() -> None:
    short = parse_args(
        ["--channel", "backfill", "--channel", "live", "--model", "deepfm", "--lr", "0.01",
         "--embedding-dim", "8", "--cowclip", "--mix", "backfill", "1", "live", "3"]
    )  # fmt: skip
    long = parse_args(
        ["--channels", "backfill", "--channels", "live", "--model.name", "deepfm",
         "--optim.lr", "0.01", "--model.embedding-dim", "8", "--optim.cowclip",
         "--mix", "backfill", "1", "live", "3"]
    )  # fmt: skip
    assert short == long
    assert short.channels == ("backfill", "live")
    assert short.model == ModelConfig("deepfm", embedding_dim=8)
    assert short.optim == OptimConfig(lr=0.01, cowclip=True)
    assert short.mix == {"backfill": 1.0, "live": 3.0}


def test_the_baselines_and_early_stopping_are_flags() -> None:
    config = parse_args(
        ["--channel", "train", "--eval-channel", "test", "--model", "popularity",
         "--model.field", "item_id", "--early-stop", "2", "--early-stop-on", "logloss"]
    )  # fmt: skip
    assert config.model == ModelConfig("popularity", field="item_id")
    assert (config.early_stop, config.early_stop_on) == (2, "logloss")
    # Patience is how long a run trains, like epochs: more of it goes on from a checkpoint.
    assert "early_stop" not in config.identity()


def test_the_embedding_l2_is_on_by_default_only_when_rows_are_read_several_times() -> None:
    def decay(*flags: str) -> float | None:
        return parse_args(["--channel", "train", *flags]).effective_optim.embedding_weight_decay

    assert decay() == 0.0  # one pass
    assert decay("--epochs", "10", "--early-stop", "1", "--eval-channel", "test") == 1e-4
    assert decay("--epochs", "3", "--follow") == 0.0  # following reads each row once
    # An explicit penalty wins, either the tables' own or the one of both groups.
    assert decay("--epochs", "3", "--optim.embedding-weight-decay", "0") == 0.0
    assert decay("--epochs", "3", "--optim.weight-decay", "1e-6") is None  # uses weight_decay
    assert parse_args(["--channel", "t", "--epochs", "3"]).optim == OptimConfig()


def test_a_config_file_is_read_and_flags_override_it(tmp_path: Path) -> None:
    file = save_config(TrainConfig(channels=("live",), batch_size=256), tmp_path / "run.json")
    config = parse_args(["--config", str(file), "--batch-size", "512", "--no-tracking"])
    assert config == TrainConfig(channels=("live",), batch_size=512, tracking=False)
    assert parse_args([f"--config={file}"]).batch_size == 256


@settings(max_examples=40, deadline=None)
@given(
    channels=st.lists(st.sampled_from(["a", "b", "live"]), min_size=1, max_size=3, unique=True),
    model=st.sampled_from(["deepfm", "dlrm", "wide_deep"]),
    hidden=st.lists(st.integers(1, 512), min_size=1, max_size=3),
    lr=st.floats(1e-5, 1.0),
    bf16=st.sampled_from([None, True, False]),
    checkpoints=st.sampled_from([None, "/tmp/ckpt"]),
)
def test_a_config_survives_its_json_file(
    channels: list[str],
    model: str,
    hidden: list[int],
    lr: float,
    bf16: bool | None,
    checkpoints: str | None,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    config = TrainConfig(
        channels=tuple(channels),
        model=ModelConfig(model, hidden=tuple(hidden)),  # type: ignore[arg-type]
        optim=OptimConfig(lr=lr),
        mix=dict.fromkeys(channels, 1.0),
        bf16=bf16,
        checkpoint_dir=checkpoints or None,
    )
    path = save_config(config, tmp_path_factory.mktemp("cfg") / "run.json")
    assert load_config(path) == config


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"channels": ["a"], "batch_sise": 3}, r"'batch_sise'; did you mean 'batch_size'\?"),
        ({"channels": ["a"], "model": {"nmae": "dlrm"}}, r"run.json.model: unknown setting 'nmae'"),
        ({"channels": ["a"], "model": {"name": "bert"}}, r"model.name: Input should be"),
        ({"channels": ["a"], "batch_size": 1}, "batch size and window"),
        ({"channels": []}, "name at least one channel"),
    ],
)  # fmt: skip
def test_a_bad_config_file_names_the_setting(
    tmp_path: Path, data: dict[str, object], message: str
) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_a_missing_or_broken_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        parse_args(["--config", str(tmp_path / "bad.json")])


def test_a_refused_setting_raises_config_error_not_a_usage_exit() -> None:
    with pytest.raises(ConfigError, match=r"--holdout-share 1\.5"):
        parse_args(["--channel", "a", "--holdout-share", "1.5"])


def test_delayed_feedback_oracle_and_windows_are_flags_and_checked() -> None:
    config = parse_args(
        ["--channel", "live", "--delayed-feedback", "off", "--oracle", "p_click",
         "--metrics-window-s", "600", "--produced-time", "kafka_ts"]
    )  # fmt: skip
    assert config.delayed_feedback == "off"
    assert config.oracle == "p_click"
    assert config.metrics_window_s == 600
    assert config.produced_time == "kafka_ts"
    defaults = TrainConfig(channels=("live",))
    assert defaults.delayed_feedback == "auto"
    assert defaults.produced_time == "produced_at"
    with pytest.raises(ConfigError, match="--oracle 'label' names a column the model"):
        TrainConfig(channels=("live",), oracle="label")
    with pytest.raises(ConfigError, match="--oracle 'seq_items'"):
        TrainConfig(channels=("live",), oracle="seq_items")
    with pytest.raises(ConfigError, match="--metrics-window-s -1"):
        TrainConfig(channels=("live",), metrics_window_s=-1)
    with pytest.raises(ConfigError, match="--delayed-feedback 'es-dfm'"):
        TrainConfig(channels=("live",), delayed_feedback="es-dfm")  # type: ignore[arg-type]


def test_the_namespace_decides_the_handoff_and_checkpoints(tmp_path: Path) -> None:
    stack = StackConfig.from_env(stack_env_for(tmp_path))
    config = TrainConfig(channels=("backfill", "live"), namespace="ctr").resolved(stack)
    assert config.location == f"{stack.handoff}/ctr"
    assert config.checkpoint_dir is not None
    folder = Path(config.checkpoint_dir)
    assert folder.parent == Path(stack.checkpoints) / "ctr" / "trainer" / "backfill-live"
    assert folder.name.startswith("dlrm-")
    given = TrainConfig(channels=("x",), handoff="/data/h", checkpoint_dir=str(tmp_path))
    assert (given.resolved(stack).handoff, given.checkpoint_dir) == ("/data/h", str(tmp_path))
    with pytest.raises(ConfigError, match="not set"):
        _ = TrainConfig(channels=("x",)).location


def test_a_run_with_other_settings_gets_its_own_checkpoint_folder(tmp_path: Path) -> None:
    stack = StackConfig.from_env(stack_env_for(tmp_path))

    def folder(**changes: Any) -> str | None:
        return TrainConfig(channels=("live",), **changes).resolved(stack).checkpoint_dir

    assert folder() == folder(max_steps=10, device="cpu", log_every=1)  # how long, where
    # More epochs go on from a checkpoint, but one against several changes a default (the
    # embedding L2 of several passes): the effective settings differ.
    assert folder(epochs=2) == folder(epochs=3) != folder()
    others = [
        folder(optim=OptimConfig(lr=0.5)),
        folder(model=ModelConfig("deepfm")),
        folder(batch_size=512),
        folder(seed=1),
        folder(handoff=str(tmp_path / "elsewhere")),
    ]
    assert len({folder(), *others}) == 1 + len(others)
    assert Path(str(folder(model=ModelConfig("deepfm")))).name.startswith("deepfm-")


def test_a_namespace_goes_into_the_path_of_a_uri_with_options(tmp_path: Path) -> None:
    query = "region=us-east-1&endpoint_override=127.0.0.1:9&scheme=http"
    env = stack_env_for(tmp_path) | {
        "FLOW_HANDOFF": f"s3://lake/handoff?{query}",
        "FLOW_FEATURE_STATE": f"s3://lake/state/?{query}",
    }
    stack = StackConfig.from_env(env)
    where = namespace_locations(stack, "ctr")
    assert where.handoff.uri == f"s3://lake/handoff/ctr?{query}"
    assert where.handoff.path == "lake/handoff/ctr"
    assert where.feature_state.uri == f"s3://lake/state/ctr?{query}"
    assert where.checkpoints.uri == f"s3://lake/checkpoints/ctr?{query}"  # beside the handoff
    trainer = TrainConfig(channels=("live",), namespace="ctr").resolved(stack)
    assert trainer.location == f"s3://lake/handoff/ctr?{query}"
    with pytest.raises(ConfigError, match="plain name"):
        namespace_locations(stack, "a/b")


def test_dynamic_tables_come_from_a_config_file_and_a_typo_in_one_is_named(
    tmp_path: Path,
) -> None:
    entry = {"feature": "item_id", "kind": "dynamic", "rows": 64, "min_count": 2}
    given = {"handoff": "/h", "channels": ["t"], "model": {"name": "deepfm", "embeddings": [entry]}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(given))
    loaded = load_config(path)
    assert loaded.model.embeddings == (EmbeddingConfig("item_id", rows=64, min_count=2),)
    assert load_config(save_config(loaded, tmp_path / "again.json")) == loaded
    path.write_text(json.dumps({**given, "model": {"embeddings": [{**entry, "min_cont": 3}]}}))
    with pytest.raises(ConfigError, match=r"embeddings.0: unknown setting 'min_cont'; did you"):
        load_config(path)


def test_a_run_without_dynamic_tables_keeps_its_identity() -> None:
    # Checkpoints recorded before ModelConfig.embeddings existed still belong to their runs.
    plain = TrainConfig(handoff="/h", channels=("t",))
    assert "embeddings" not in plain.identity()["model"]
    table = ModelConfig(embeddings=(EmbeddingConfig("item_id"),))
    assert (
        "embeddings" in TrainConfig(handoff="/h", channels=("t",), model=table).identity()["model"]
    )


def test_a_probe_names_the_options_given_and_the_roots_otherwise(tmp_path: Path) -> None:
    stack = StackConfig.from_env(stack_env_for(tmp_path))
    run = TrainConfig(namespace="ctr", channels=("live",))
    assert location_settings(run.resolved(stack), stack) == (
        "FLOW_HANDOFF",
        "FLOW_CHECKPOINTS (unset: in FLOW_HOME)",
    )
    named = replace(run, handoff=str(tmp_path / "h"), checkpoint_dir=str(tmp_path / "c"))
    handoff, checkpoints = location_settings(named.resolved(stack), stack)
    assert handoff.startswith("--handoff")
    assert checkpoints == "--checkpoint-dir"
