"""The session factory under spark-submit keeps what spark-submit was given."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from flow.config import StackConfig
from spark_jobs.submit import launch_env, spark_submit_executable
from tests.support import clean_environ, run_flow

pytestmark = pytest.mark.integration

APP = """
import json
from spark_jobs.jvm import launch_conf
from spark_jobs.session import get_session
spark = get_session(app_name="submit-test")
conf = launch_conf(spark)
print("RESULT " + json.dumps({
    "master": conf.get("spark.master"),
    "partitions": spark.conf.get("spark.sql.shuffle.partitions"),
    "catalog": spark.conf.get("spark.sql.catalog.flow.catalog-impl"),
    "tz": spark.conf.get("spark.sql.session.timeZone"),
    "codegen": spark.conf.get("spark.sql.codegen.hugeMethodLimit"),
    "rows": spark.range(10).count(),
}))
"""


def _result(stdout: str) -> dict[str, object]:
    line = next(x for x in stdout.splitlines() if x.startswith("RESULT "))
    return dict(json.loads(line.removeprefix("RESULT ")))


def test_flow_submit_keeps_the_users_master_and_conf(
    running_stack: StackConfig, stack_env: dict[str, str], tmp_path: Path
) -> None:
    app = tmp_path / "app.py"
    app.write_text(APP)
    done = run_flow(
        [
            "submit",
            "--master",
            "local[1]",
            "--conf",
            "spark.sql.shuffle.partitions=7",
            "--conf",
            "spark.sql.codegen.hugeMethodLimit=65535",  # the stack's is 8000
            str(app),
        ],
        stack_env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert _result(done.stdout) == {
        "master": "local[1]",
        "partitions": "7",
        "catalog": "org.apache.iceberg.jdbc.JdbcCatalog",
        "tz": "UTC",
        "codegen": "65535",
        "rows": 10,
    }


def test_a_plain_spark_submit_without_the_jars_is_told_how_to_launch(
    running_stack: StackConfig, stack_env: dict[str, str], tmp_path: Path
) -> None:
    app = tmp_path / "app.py"
    app.write_text(APP)
    done = subprocess.run(
        [spark_submit_executable(), "--master", "local[1]", str(app)],
        env={**clean_environ(), **stack_env, **launch_env("local[1]")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode != 0
    output = done.stdout + done.stderr  # spark-submit merges the app's stderr into its stdout
    assert "without the stack's jars" in output
    assert "flow submit" in output
    assert "Iceberg (iceberg-spark-runtime)" in output


def test_flow_spark_args_make_a_plain_spark_submit_work(
    running_stack: StackConfig, stack_env: dict[str, str], tmp_path: Path
) -> None:
    app = tmp_path / "app.py"
    app.write_text(APP)
    args = run_flow(["spark-args"], stack_env)
    assert args.returncode == 0, args.stderr
    done = subprocess.run(
        f"{spark_submit_executable()} --master local[2] {args.stdout.strip()} {app}",
        shell=True,
        env={**clean_environ(), **stack_env, **launch_env("local[2]")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = _result(done.stdout)
    assert result["master"] == "local[2]"
    assert result["catalog"] == "org.apache.iceberg.jdbc.JdbcCatalog"
    assert result["codegen"] == "8000"


SECRET_APP = """
import json, os
import psutil
from spark_jobs.jvm import launch_conf
from spark_jobs.session import get_session
spark = get_session(app_name="secret-test")
secret = os.environ["TEST_FAKE_SECRET"]
leaks = [
    p.info["pid"] for p in psutil.process_iter(["pid", "cmdline"])
    if any(secret in arg for arg in p.info["cmdline"] or ())
]
# The driver JVM: spark-submit's (the parent) under spark-submit, else the one pyspark started.
me = psutil.Process()
jvm = me.parent() if "PYSPARK_GATEWAY_PORT" in os.environ else me.children()[0]
print("RESULT " + json.dumps({
    "leaks": leaks,
    "jvm": " ".join(jvm.cmdline()),
    "seen": launch_conf(spark).get("spark.sql.catalog.flow.s3.secret-access-key")
    == secret,
    "rows": spark.range(3).count(),
}))
"""


def _with_secret(stack_env: dict[str, str]) -> tuple[str, dict[str, str]]:
    secret = f"fake-{uuid.uuid4().hex}=a:b#c"
    env = {
        **stack_env,
        "FLOW_CATALOG_PROPERTIES": f"s3.endpoint=http://127.0.0.1:1,s3.secret-access-key={secret}",
        "TEST_FAKE_SECRET": secret,
    }
    return secret, env


def test_flow_submit_keeps_a_secret_off_every_command_line(
    running_stack: StackConfig, stack_env: dict[str, str], tmp_path: Path
) -> None:
    app = tmp_path / "app.py"
    app.write_text(SECRET_APP)
    secret, env = _with_secret(stack_env)
    done = run_flow(["submit", "--master", "local[1]", str(app)], env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = _result(done.stdout)
    assert result["leaks"] == []
    assert "org.apache.spark.deploy.SparkSubmit" in str(result["jvm"])
    assert "--properties-file" in str(result["jvm"])
    assert result["seen"] is True  # the job has it in its SparkConf all the same
    assert result["rows"] == 3
    assert "$ " in done.stderr
    assert secret not in done.stderr + done.stdout  # nor printed
    assert list((running_stack.home / "private").iterdir()) == []  # deleted after the job


def test_a_session_pyspark_starts_keeps_a_secret_off_the_jvms_command_line(
    running_stack: StackConfig, stack_env: dict[str, str], tmp_path: Path
) -> None:
    app = tmp_path / "app.py"
    app.write_text(SECRET_APP)
    _, env = _with_secret({**stack_env, "FLOW_SPARK_MASTER": "local[1]"})
    done = subprocess.run(
        [sys.executable, str(app)],
        env={**clean_environ(), **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = _result(done.stdout)
    assert result["leaks"] == []
    assert "pyspark-shell" in str(result["jvm"])
    assert result["seen"] is True


BAD_DEFINITION = """
from flow.pipeline import LabelJoin, run_main

run_main(LabelJoin("clicks", key="id", windw="5 minutes"))
"""


def test_a_mistake_in_a_pipeline_file_under_flow_run_is_one_line_and_its_exit_code(
    running_stack: StackConfig, stack_env: dict[str, str], tmp_path: Path
) -> None:
    app = tmp_path / "bad.py"
    app.write_text(BAD_DEFINITION)
    done = run_flow(["run", str(app)], stack_env)
    assert done.returncode == 1
    output = done.stdout + done.stderr  # spark-submit merges the app's stderr into its stdout
    assert "Traceback" not in output
    assert [line for line in output.splitlines() if line.startswith("error:")] == [
        "error: LabelJoin(windw='5 minutes'): LabelJoin has no field 'windw'; its fields: "
        "source, key, window, label, label_time, strategy; did you mean 'window'?"
    ]
    # Caught as flow run builds the pipeline, before the stack or spark-submit start.
    assert "$ " not in output, "spark-submit was started"
    debug = run_flow(["--debug", "run", str(app)], stack_env)
    assert debug.returncode == 1
    assert "Traceback (most recent call last)" in debug.stdout + debug.stderr


CONNECTORS_APP = """
import json
from spark_jobs.jvm import jvm as spark_jvm
from spark_jobs.session import get_session
spark = get_session(app_name="connectors-test")
jvm = spark_jvm(spark)
loadable = jvm.org.apache.spark.util.Utils.classIsLoadable
print("RESULT " + json.dumps({
    "extensions": spark.conf.get("spark.sql.extensions"),
    "delta": loadable("org.apache.spark.sql.delta.catalog.DeltaCatalog"),
    "kafka": loadable("org.apache.spark.sql.kafka010.KafkaSourceProvider"),
    "namespaces": spark.sql("SHOW NAMESPACES IN flow").count(),  # the Iceberg catalog works
    "rows": spark.range(3).count(),
}))
"""


def test_a_job_given_no_kafka_or_delta_starts_without_their_jars_and_asks_for_neither(
    running_stack: StackConfig, stack_env: dict[str, str], tmp_path: Path
) -> None:
    app = tmp_path / "app.py"
    app.write_text(CONNECTORS_APP)
    done = run_flow(["submit", "--connectors", "none", "--master", "local[1]", str(app)], stack_env)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    result = _result(done.stdout)
    assert (result["delta"], result["kafka"]) == (False, False)  # their jars were left out
    assert "Delta" not in str(result["extensions"])  # and the session asked for no Delta class
    assert result["rows"] == 3
    kafka = run_flow(
        ["submit", "--connectors", "kafka", "--master", "local[1]", str(app)], stack_env
    )
    assert kafka.returncode == 0, kafka.stderr[-3000:]
    assert {k: _result(kafka.stdout)[k] for k in ("delta", "kafka")} == {
        "delta": False,
        "kafka": True,
    }
