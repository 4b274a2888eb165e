"""Which keys hold secrets, and how commands, properties lists, JSON and dicts are redacted."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.secrets import (
    REDACTED,
    is_secret,
    is_secret_key,
    new_private_file,
    private_dir,
    redact_argv,
    redact_mapping,
    redact_text,
    rewrite_private_file,
)

SECRET_KEYS = [
    # S3A and Iceberg S3FileIO credentials, as Spark confs and as catalog properties
    "spark.hadoop.fs.s3a.secret.key",
    "spark.hadoop.fs.s3a.access.key",  # holds the key id; Spark's own redaction hides it too
    "spark.hadoop.fs.s3a.session.token",
    "spark.hadoop.fs.s3a.encryption.key",
    "s3.secret-access-key",
    "s3.session-token",
    "spark.sql.catalog.x.s3.secret-access-key",
    "spark.sql.catalog.x.s3.sse.key",
    # Iceberg REST and JDBC catalogs
    "client.secret",
    "spark.sql.catalog.x.credential",
    "spark.sql.catalog.x.token",
    "spark.sql.catalog.x.jdbc.password",
    "spark.sql.catalog.x.header.Authorization",
    # environment variables
    "AWS_SECRET_ACCESS_KEY",
    "aws_session_token",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "OPENAI_API_KEY",
    # Spark, Kafka, Azure, GCS
    "spark.authenticate.secret",
    "spark.ssl.keyStorePassword",
    "spark.ssl.keyPassword",
    "kafka.ssl.key.password",
    "kafka.sasl.jaas.config",
    "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net",
    "spark.hadoop.fs.gs.auth.service.account.private.key",
    "adls.auth.shared-key.account.key",
    "gcs.oauth2.token",
    "ssl.key.passphrase",
    "db.passwd",
    "apiKey",
]

PUBLIC_KEYS = [
    "spark.sql.shuffle.partitions",
    "spark.sql.session.timeZone",
    "spark.jars",
    "spark.driver.extraJavaOptions",
    "keystore.type",
    "spark.ssl.keyStoreType",
    "spark.ssl.keyStore",  # a path
    "spark.kerberos.keytab",
    "spark.kerberos.principal",
    "spark.io.encryption.keySizeBits",
    "spark.network.crypto.keyLength",
    "spark.hadoop.google.cloud.auth.service.account.json.keyfile",  # a path
    "s3.access-key-id",  # names a key, holds none
    "AWS_ACCESS_KEY_ID",
    "s3.endpoint",
    "s3.path-style-access",
    "spark.hadoop.fs.s3a.endpoint",
    "spark.sql.catalog.flow.uri",
    "spark.sql.catalog.flow.warehouse",
    "spark.sql.catalog.flow.oauth2-server-uri",
    "spark.sql.catalog.x.s3.sse.type",
    "kafka.bootstrap.servers",
    "kafka.key.serializer",
    "FLOW_CATALOG_PROPERTIES",
]


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_secret_keys_are_recognised(key: str) -> None:
    assert is_secret_key(key)
    assert is_secret_key(key.upper())


@pytest.mark.parametrize("key", PUBLIC_KEYS)
def test_public_keys_are_left_alone(key: str) -> None:
    assert not is_secret_key(key)
    assert redact_argv(["--conf", f"{key}=v1"]) == ["--conf", f"{key}=v1"]


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (
            ["--conf", "spark.hadoop.fs.s3a.secret.key=abc", "--conf", "spark.x=1", "app.py"],
            [
                "--conf",
                f"spark.hadoop.fs.s3a.secret.key={REDACTED}",
                "--conf",
                "spark.x=1",
                "app.py",
            ],
        ),
        (["--conf=client.secret=abc"], [f"--conf=client.secret={REDACTED}"]),
        (["-c", "s3.session-token=abc"], ["-c", f"s3.session-token={REDACTED}"]),
        # One argument is one value: a secret holding a comma is hidden whole.
        (
            ["--conf", "spark.x.jdbc.password=a,b c"],
            ["--conf", f"spark.x.jdbc.password={REDACTED}"],
        ),
        (["AWS_SECRET_ACCESS_KEY=abc", "env"], [f"AWS_SECRET_ACCESS_KEY={REDACTED}", "env"]),
        (["--password", "abc", "--user", "me"], ["--password", REDACTED, "--user", "me"]),
        (
            ["--driver-java-options", "-Dx=1 -Dfs.s3a.secret.key=abc -Dy=2"],
            ["--driver-java-options", f"-Dx=1 -Dfs.s3a.secret.key={REDACTED} -Dy=2"],
        ),
        # ...and from a secret key at the start of an argument to its end.
        (["-Dfs.s3a.secret.key=abc -Dy=2"], [f"-Dfs.s3a.secret.key={REDACTED}"]),
        (
            ["--conf", "spark.driver.extraJavaOptions=-Dlog=file:/a -Dx.password=abc"],
            ["--conf", f"spark.driver.extraJavaOptions=-Dlog=file:/a -Dx.password={REDACTED}"],
        ),
        (
            ["FLOW_CATALOG_PROPERTIES=s3.endpoint=http://h:9000,s3.secret-access-key=abc"],
            [f"FLOW_CATALOG_PROPERTIES=s3.endpoint=http://h:9000,s3.secret-access-key={REDACTED}"],
        ),
        (
            ["/opt/secret-tools/bin/spark-submit", "job.py"],
            ["/opt/secret-tools/bin/spark-submit", "job.py"],
        ),
    ],
)
def test_command_lines_are_redacted(argv: list[str], shown: list[str]) -> None:
    assert redact_argv(argv) == shown


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # FLOW_CATALOG_PROPERTIES and other properties lists, by comma or semicolon
        (
            "s3.endpoint=http://h:9000,s3.secret-access-key=abc,s3.path-style-access=true",
            f"s3.endpoint=http://h:9000,s3.secret-access-key={REDACTED},s3.path-style-access=true",
        ),
        ("client.id=me; client.secret=abc; x=1", f"client.id=me; client.secret={REDACTED}; x=1"),
        # env-style lines
        (
            "AWS_ACCESS_KEY_ID=AKIA1\nAWS_SECRET_ACCESS_KEY=abc\n",
            f"AWS_ACCESS_KEY_ID=AKIA1\nAWS_SECRET_ACCESS_KEY={REDACTED}\n",
        ),
        # JSON
        (
            json.dumps({"s3.secret-access-key": "abc", "rows": 3, "token": None}),
            json.dumps({"s3.secret-access-key": REDACTED, "rows": 3, "token": None}).replace(
                '"token": null', f'"token": {REDACTED}'
            ),
        ),
        # Kafka JAAS and JDBC URLs
        (
            'PlainLoginModule required username="u" password="abc";',
            f'PlainLoginModule required username="u" password={REDACTED};',
        ),
        (
            "jdbc:postgresql://db/x?user=u&password=abc",
            f"jdbc:postgresql://db/x?user=u&password={REDACTED}",
        ),
        ("https://me:abc@catalog.example.com/v1", f"https://me:{REDACTED}@catalog.example.com/v1"),
        ("http://host:8080/path", "http://host:8080/path"),
    ],
)
def test_text_is_redacted(text: str, shown: str) -> None:
    assert redact_text(text) == shown
    assert "abc" not in redact_text(text)


def test_mappings_are_redacted_at_any_depth() -> None:
    params = {
        "catalog": {"s3.secret-access-key": "abc", "s3.endpoint": "http://h"},
        "AWS_SESSION_TOKEN": "abc",
        "command": "flow submit --conf client.secret=abc app.py",
        "confs": [{"spark.sql.catalog.x.token": "abc"}, "spark.x.password=abc"],
        "rows": 3,
    }
    assert redact_mapping(params) == {
        "catalog": {"s3.secret-access-key": REDACTED, "s3.endpoint": "http://h"},
        "AWS_SESSION_TOKEN": REDACTED,
        "command": f"flow submit --conf client.secret={REDACTED} app.py",
        "confs": [{"spark.sql.catalog.x.token": REDACTED}, f"spark.x.password={REDACTED}"],
        "rows": 3,
    }


def test_a_value_that_embeds_a_secret_is_secret() -> None:
    assert is_secret("spark.driver.extraJavaOptions", "-Dx=1 -Dfs.s3a.secret.key=abc")
    assert is_secret("spark.sql.catalog.x.uri", "https://me:abc@host/")
    assert not is_secret("spark.driver.extraJavaOptions", "-Dlog4j2.configurationFile=file:/x")
    assert not is_secret("spark.jars", "/a/secret-tools.jar,/b.jar")


def test_a_bad_catalog_property_is_named_without_its_secret() -> None:
    with pytest.raises(ConfigError) as caught:
        StackConfig.from_env({"FLOW_CATALOG_PROPERTIES": "s3.endpoint=http://h,s3.token:abc"})
    assert "abc" not in str(caught.value)
    assert "abc" not in str(caught.value.__cause__)  # pydantic's error, chained
    catalog = StackConfig.from_env({"FLOW_CATALOG_PROPERTIES": "client.secret=abc"}).catalog
    assert "abc" not in repr(catalog)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_private_files_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    (tmp_path / "private").mkdir(mode=0o755)
    fresh = new_private_file(tmp_path, "a=1\n", ".properties")
    again = rewrite_private_file(tmp_path, "spark-args.properties", "b=2\n")
    rewritten = rewrite_private_file(tmp_path, "spark-args.properties", "b=3\n")
    assert _mode(private_dir(tmp_path)) == 0o700
    assert (_mode(fresh), _mode(rewritten)) == (0o600, 0o600)
    assert again == rewritten
    assert rewritten.read_text() == "b=3\n"
    assert sorted(p.name for p in private_dir(tmp_path).iterdir()) == sorted(
        [fresh.name, "spark-args.properties"]
    )


def test_the_files_of_a_process_that_died_are_removed_by_the_next_one(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from flow.secrets import new_private_file; "
        "print(new_private_file(Path(sys.argv[1]), 'a=1'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    left = Path(done.stdout.strip())
    assert left.exists()
    mine = new_private_file(tmp_path, "b=2")
    assert not left.exists()
    assert mine.exists()
