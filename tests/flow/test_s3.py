"""One S3 configuration for every s3:// location, and start-up checks that name the fix.

The settings reach each client as it wants them (pyarrow, pyiceberg, Spark's S3FileIO and S3A,
the executors' environment); the probes run against a real S3-compatible server (moto's).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flow.config import S3Config, StackConfig
from flow.errors import ConfigError
from flow.stack.iceberg import pyiceberg_properties
from flow.storage import check_storage, location, namespace_locations
from spark_jobs.conf import session_conf
from spark_jobs.submit import submit_options
from tests.conftest import S3Server
from tests.support import REPO, free_ports, run_flow, stack_env_for
from trainers.checkpoint import Checkpointer


def s3_stack(tmp_path: object, **more: str) -> StackConfig:
    env = {
        **stack_env_for(tmp_path),  # type: ignore[arg-type]
        "FLOW_WAREHOUSE": "s3://lake/warehouse",
        "FLOW_HANDOFF": "s3://flow/handoff",
        "FLOW_FEATURE_STATE": "s3://flow/feature-state",
        **more,
    }
    return StackConfig.from_env(env)


def test_flow_settings_win_over_the_aws_variables_and_path_style_follows_the_endpoint() -> None:
    aws = {
        "AWS_ENDPOINT_URL": "http://aws-one:9000",
        "AWS_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "id",
        "AWS_SECRET_ACCESS_KEY": "secret",
    }
    assert S3Config.from_env(aws) == S3Config(
        "http://aws-one:9000", "eu-west-1", True, "id", "secret"
    )
    ours = {**aws, "FLOW_S3_ENDPOINT": "https://minio:9000", "FLOW_S3_REGION": "x-1"}
    config = S3Config.from_env({**ours, "FLOW_S3_PATH_STYLE": "0"})
    assert (config.endpoint_host, config.scheme, config.region) == ("minio:9000", "https", "x-1")
    assert not config.path_style
    assert S3Config.from_env({}) == S3Config()  # AWS itself, virtual-hosted, default chain


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"FLOW_S3_ENDPOINT": "127.0.0.1:9000"}, r"has no scheme; write http://127.0.0.1:9000"),
        ({"AWS_ACCESS_KEY_ID": "id"}, r"AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY"),
        ({"FLOW_S3_PATH_STYLE": "maybe"}, r"FLOW_S3_PATH_STYLE='maybe' is not a flag"),
    ],
)
def test_a_bad_s3_setting_names_the_fix(env: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        S3Config.from_env(env)


def test_checkpoints_go_beside_a_remote_handoff_unless_set(tmp_path: object) -> None:
    assert s3_stack(tmp_path).checkpoints == "s3://flow/checkpoints"
    bucket_root = s3_stack(tmp_path, FLOW_HANDOFF="s3://flow")
    assert bucket_root.checkpoints == "s3://flow/checkpoints"
    given = s3_stack(tmp_path, FLOW_CHECKPOINTS="s3://other/ck")
    assert namespace_locations(given, "ns").checkpoints.uri == "s3://other/ck/ns"
    local = StackConfig.from_env(stack_env_for(tmp_path))  # type: ignore[arg-type]
    assert local.checkpoints == str(local.home / "checkpoints")
    assert not local.uses_s3


def test_every_engine_gets_the_same_s3_settings_and_catalog_properties_win(
    tmp_path: object,
) -> None:
    s3 = {"FLOW_S3_ENDPOINT": "http://127.0.0.1:9000", "AWS_ACCESS_KEY_ID": "id"}
    stack = s3_stack(tmp_path, **s3, AWS_SECRET_ACCESS_KEY="secret")
    conf = session_conf(stack, local=False)
    catalog = f"spark.sql.catalog.{stack.catalog.name}"
    assert conf[f"{catalog}.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert conf[f"{catalog}.s3.endpoint"] == "http://127.0.0.1:9000"
    assert conf[f"{catalog}.s3.path-style-access"] == "true"
    assert conf[f"{catalog}.s3.secret-access-key"] == "secret"
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert conf["spark.executorEnv.FLOW_S3_ENDPOINT"] == "http://127.0.0.1:9000"
    assert conf["spark.executorEnv.AWS_SECRET_ACCESS_KEY"] == "secret"
    props = pyiceberg_properties(stack.catalog)
    assert props["s3.endpoint"] == "http://127.0.0.1:9000"
    assert props["s3.force-virtual-addressing"] == "false"
    mine = s3_stack(
        tmp_path, **s3, AWS_SECRET_ACCESS_KEY="s", FLOW_CATALOG_PROPERTIES="s3.endpoint=http://w:1"
    )
    assert pyiceberg_properties(mine.catalog)["s3.endpoint"] == "http://w:1"
    assert session_conf(mine, local=False)[f"{catalog}.s3.endpoint"] == "http://w:1"
    local = StackConfig.from_env(stack_env_for(tmp_path))  # type: ignore[arg-type]
    assert not any("s3" in key for key in session_conf(local, local=True))


def test_the_executors_secrets_stay_off_the_spark_submit_command_line(tmp_path: object) -> None:
    stack = s3_stack(
        tmp_path,
        FLOW_S3_ENDPOINT="http://127.0.0.1:9000",
        AWS_ACCESS_KEY_ID="id",
        AWS_SECRET_ACCESS_KEY="very-secret",
        AWS_SESSION_TOKEN="token-value",
    )
    line = " ".join(submit_options(stack, "spark://127.0.0.1:7077"))
    assert "very-secret" not in line
    assert "token-value" not in line
    assert "spark.executorEnv.FLOW_S3_ENDPOINT=http://127.0.0.1:9000" in line
    assert "--properties-file" in line


def test_plain_s3_uris_use_the_environments_settings(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    where = location("s3://flow/plain").child("a")
    where.write_bytes("x.txt", b"hello")
    assert location("s3a://flow/plain/a").read_bytes("x.txt") == b"hello"
    assert where.hadoop_uri == "s3a://flow/plain/a"
    with pytest.raises(ConfigError, match="Spark cannot read S3 options"):
        _ = location("s3://k:s@flow/p?endpoint_override=127.0.0.1:1").hadoop_uri


def test_a_missing_bucket_or_an_unreachable_endpoint_is_one_line_naming_the_fix(
    s3_server: S3Server, tmp_path: object
) -> None:
    missing = s3_stack(tmp_path, **s3_server.env(), FLOW_HANDOFF="s3://no-such-bucket/h")
    with pytest.raises(ConfigError) as said:
        check_storage(missing, "FLOW_HANDOFF")
    assert str(said.value).startswith(
        "FLOW_HANDOFF: cannot write to s3://no-such-bucket/h: bucket 'no-such-bucket' does not "
        f"exist at {s3_server.endpoint}; create it"
    )
    (port,) = free_ports(1)
    nobody = {**s3_server.env(), "FLOW_S3_ENDPOINT": f"http://127.0.0.1:{port}"}
    with pytest.raises(ConfigError, match=rf"the S3 endpoint http://127.0.0.1:{port} cannot be"):
        check_storage(s3_stack(tmp_path, **nobody), "FLOW_FEATURE_STATE")
    check_storage(s3_stack(tmp_path, **s3_server.env()))  # all four roots: buckets exist


def test_an_access_denied_names_the_credentials() -> None:
    stack = S3Config("http://127.0.0.1:9", access_key="a", secret_key="b")
    where = location("s3://flow/x", stack)
    denied = OSError("AWS Error ACCESS_DENIED during PutObject operation: Access Denied")
    assert "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY" in where._why(denied, "FLOW_HANDOFF")


def test_trainer_checkpoints_are_saved_resumed_pruned_and_cleared_on_s3(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    checkpoints = Checkpointer("s3://flow/trainer-ck", keep=2)
    checkpoints.check_writable()
    for step in (10, 20, 30):
        checkpoints.save(step, {"model": {"w": step}}, {"cursor": step})
    assert checkpoints.latest() == 30
    loaded = checkpoints.load()
    assert loaded is not None
    assert loaded[0]["model"] == {"w": 30}
    assert loaded[0]["step"] == 30
    assert loaded[1] == {"cursor": 30}
    assert checkpoints.folder.list(folders=True) == ["step-000000000020", "step-000000000030"]
    checkpoints.clear()
    assert checkpoints.latest() is None
    assert checkpoints.folder.list(folders=True) == []


def test_the_checkpoints_setting_is_named_as_the_user_gave_it(tmp_path: object) -> None:
    """Unset, the checkpoints default beside a remote handoff (or in FLOW_HOME): an error about
    them says so, and does not blame a FLOW_CHECKPOINTS the user never set as if they had."""
    assert s3_stack(tmp_path).checkpoints_from == "FLOW_CHECKPOINTS (unset: beside FLOW_HANDOFF)"
    given = s3_stack(tmp_path, FLOW_CHECKPOINTS="s3://flow/ck")
    assert given.checkpoints_from == "FLOW_CHECKPOINTS"
    local = StackConfig.from_env(stack_env_for(tmp_path))  # type: ignore[arg-type]
    assert local.checkpoints_from == "FLOW_CHECKPOINTS (unset: in FLOW_HOME)"


def test_flow_run_finds_a_missing_checkpoint_bucket_before_it_starts_anything(
    s3_server: S3Server, tmp_path: Path
) -> None:
    env = {
        **stack_env_for(tmp_path / "home"),
        **s3_server.env(),
        "PYTHONPATH": str(REPO),
        "FLOW_HANDOFF": "s3://flow/handoff",
        "FLOW_CHECKPOINTS": "s3://no-such-ck/ck",
    }
    done = run_flow(["run", "pipelines/ctr_streaming.py"], env, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "error: FLOW_CHECKPOINTS: cannot write to s3://no-such-ck/ck/ctr/ctr_streaming/live: "
            f"bucket 'no-such-ck' does not exist at {s3_server.endpoint}"
        )
    ), done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("where", "blamed"),
    [
        # The default checkpoints go beside the handoff, into its missing bucket: the handoff
        # is what the user gave, and what an error names (it named --checkpoint-dir).
        ({"FLOW_HANDOFF": "s3://no-such-h/handoff"}, "FLOW_HANDOFF: cannot read s3://no-such-h"),
        (
            {"FLOW_HANDOFF": "s3://flow/handoff", "FLOW_CHECKPOINTS": "s3://no-such-ck/ck"},
            "FLOW_CHECKPOINTS: cannot write to s3://no-such-ck/ck/ctr/trainer/backfill/dlrm-",
        ),
    ],
    ids=["handoff-bucket", "checkpoint-bucket"],
)
def test_a_trainer_blames_the_setting_that_chose_the_missing_bucket(
    s3_server: S3Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    where: dict[str, str],
    blamed: str,
) -> None:
    from flow.training import TrainConfig
    from trainers.train import train

    for name, value in {**stack_env_for(tmp_path), **s3_server.env(), **where}.items():
        monkeypatch.setenv(name, value)
    run = TrainConfig(namespace="ctr", channels=("backfill",), device="cpu", tracking=False)
    with pytest.raises(ConfigError) as said:
        train(run.resolved(StackConfig.from_env()), say=lambda _: None)
    assert str(said.value).startswith(blamed), said.value
    assert "does not exist" in str(said.value)
    assert "--checkpoint-dir" not in str(said.value)
