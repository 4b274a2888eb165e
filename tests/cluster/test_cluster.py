"""The same pipeline on a Spark standalone cluster as on ``local[*]``.

The master and a one-core worker come from the pyspark install (``spark-class``), on 127.0.0.1:
what a user runs against is a real cluster, whose executors are other JVMs with their own
Python workers, none of the local session's tuning, and a driver they reach over the network.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyspark
import pytest

from flow.config import S3Config, StackConfig
from flow.stack.kafka import delete_topics
from flow.storage import location, namespace_locations
from flow.workflows.loading import topics
from tests.conftest import S3Server
from tests.support import (
    REPO,
    doc_commands,
    free_ports,
    handoff_rows,
    run_flow,
    short_job_jvm,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

PIPELINE = """
from flow.pipeline import run_main
from pipelines.ctr_backfill import ctr_backfill

if __name__ == "__main__":
    run_main(ctr_backfill("{namespace}"))
"""
STREAM = """
from flow.pipeline import run_main
from pipelines.ctr_streaming import ctr_streaming

if __name__ == "__main__":
    run_main(ctr_streaming("{namespace}", label_strategy="immediate"))
"""
PRODUCTION = REPO / "docs" / "production.md"
WORKED = "## Worked example: MinIO (or any S3-compatible server) and a standalone cluster"
DRIVER = ["--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1"]
"""The driver listens where the executors can reach it, and nowhere else."""


def _alive_workers(ui: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as answer:
            return int(json.load(answer).get("aliveworkers", 0))
    except OSError:
        return 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``spark://127.0.0.1:PORT``: a standalone master and one worker with one core."""
    home = Path(pyspark.__file__).parent
    folder = tmp_path_factory.mktemp("standalone")
    port, ui, worker_ui = free_ports(3)
    env = {**os.environ, **short_job_jvm(), "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1"}
    url = f"spark://127.0.0.1:{port}"
    deploy = "org.apache.spark.deploy"
    commands = {
        "master": [f"{deploy}.master.Master", "--host", "127.0.0.1", "--port", str(port),
                   "--webui-port", str(ui)],
        "worker": [f"{deploy}.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                   "--memory", "2g", "--webui-port", str(worker_ui),
                   "--work-dir", str(folder / "work"), url],
    }  # fmt: skip
    started: list[subprocess.Popen[bytes]] = []
    try:
        for name, argv in commands.items():
            with (folder / f"{name}.log").open("wb") as log:
                started.append(
                    subprocess.Popen(
                        [str(home / "bin" / "spark-class"), *argv],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + 120
        while _alive_workers(ui) < 1:
            if time.monotonic() > deadline:
                logs = "".join((folder / f"{n}.log").read_text()[-2000:] for n in commands)
                pytest.fail(f"the standalone cluster did not come up:\n{logs}")
            time.sleep(1)
        yield url
    finally:
        for process in started:
            os.killpg(process.pid, signal.SIGTERM)
        for process in started:
            process.wait(30)


def _job(
    launch: list[str], app: Path, env: dict[str, str], handoff: Path, states: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """``flow LAUNCH APP ARGS``, its handoff and feature states in folders of its own."""
    where = {"FLOW_HANDOFF": str(handoff), "FLOW_FEATURE_STATE": str(states)}
    done = run_flow([*launch, str(app), *args], {**env, **where}, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _assert_same_channel(here: str, there: str, channel: str, more_than: int) -> None:
    """Two handoff folders hold the channel's rows alike, row for row (in any order)."""

    def rows(where: str) -> pa.Table:
        table = handoff_rows(where, channel)
        return table.sort_by("impression_id").select(sorted(table.column_names))

    mine, theirs = rows(here), rows(there)
    assert mine.num_rows == theirs.num_rows > more_than
    assert mine.equals(theirs)


def test_a_live_stage_on_the_cluster_with_a_trainer_following_writes_what_a_local_one_writes(
    cluster: str, running_stack: StackConfig, stack_env: dict[str, str], tmp_path: Path
) -> None:
    """The live stage (immediate labels) over one backlog, on local[*] and on the cluster with
    ``flow run --train`` following its channel: the same rows, counts that reconcile, and a
    trainer that trained on them."""
    namespace = f"cs{uuid.uuid4().hex[:6]}"
    history = ["generate", "history", "--namespace", namespace, "--days", "1", "--per-day", "2000"]
    assert run_flow(history, stack_env).returncode == 0
    backfill, stream = tmp_path / "backfill.py", tmp_path / "stream.py"
    backfill.write_text(PIPELINE.format(namespace=namespace))
    stream.write_text(STREAM.format(namespace=namespace))
    states = tmp_path / "states"
    local = ["submit", "--master", "local[*]"]
    _job(local, backfill, stack_env, tmp_path / "h", states, "--no-tracking")
    sent = ["generate", "stream", "--namespace", namespace, "--count", "3000"]
    assert run_flow(sent, stack_env).returncode == 0

    here_at, there_at = tmp_path / "local", tmp_path / "cluster"
    _job(local, stream, stack_env, here_at, states, "--no-tracking")
    # The same checkpoint folder would resume where the local run ended: a new one.
    namespace_locations(running_stack, namespace).checkpoints.remove()
    train = f"--namespace {namespace} --channel live --max-steps 5 --batch-size 256"
    on_cluster = ["run", "--train", train, "--master", cluster, *DRIVER]
    said = _job(on_cluster, stream, stack_env, there_at, states)
    output = said.stdout + said.stderr
    # Exit 0 is the trainer's too (flow run exits with its code); it read the channel.
    assert "reconcile" in output
    assert "channel live:" in output, output[-3000:]
    _assert_same_channel(str(here_at / namespace), str(there_at / namespace), "live", 2500)


def test_the_production_page_runs_as_printed_on_s3_and_the_cluster(
    cluster: str,
    running_stack: StackConfig,
    stack_env: dict[str, str],
    s3_server: S3Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/production.md's worked example, read from the page and run line by line: the
    warehouse, handoff, feature states and checkpoints (the stream's state stores, written by
    the cluster's executors, and the trainer's) in S3, configured once; the backfill and the
    live stage on the cluster, the trainer following the live channel, every shard verified.
    Then the page's backfill again on ``local[*]``: the cluster's channel holds the same training
    rows, row for row (the fitted state included, which needs a fit that does not depend on
    partitioning).

    Substituted: the page's endpoint (http://127.0.0.1:9000) and master (spark://HOST:7077) by
    the test's, ``.venv/bin/flow`` by this environment's, and the session's FLOW_HOME and
    ports. Added: the driver's address, as the page's note says for workers that reach the
    driver on one address only, and a catalog file of the test's own, so that namespace
    ``ctr``'s tables are this run's. The page's ``aws s3 mb`` lines are not run (the AWS CLI is
    no dependency of the project): the server starts with those buckets, checked here."""
    env = {**stack_env, "FLOW_CATALOG_URI": str(tmp_path / "catalog.db")}
    ran, submitted = [], ""
    # The page's namespace is ctr: its topics are the broker's (the session's one stack), and a
    # later test producing to ctr's topics would read this stream's records too.
    try:
        for printed in doc_commands(PRODUCTION, WORKED):
            words = [
                w.replace("http://127.0.0.1:9000", s3_server.endpoint).replace(
                    "spark://HOST:7077", cluster
                )
                for w in printed
            ]
            if words[0] == "export":
                env.update(dict(w.split("=", 1) for w in words[1:]))
                continue
            if words[0] == "aws":
                assert words[-2:-1] == ["mb"], printed
                assert location(words[-1], S3Config.from_env(env)).exists(), printed
                continue
            assert words[0] == ".venv/bin/flow", printed
            args = words[1:]
            if args[0] in ("submit", "run"):
                args[1:1] = DRIVER
            done = run_flow(args, env, timeout=900)
            said = done.stdout + done.stderr
            assert done.returncode == 0, f"{shlex.join(printed)}:\n{said[-4000:]}"
            ran.append(args[0])
            if args[0] in ("submit", "run"):
                assert "reconcile" in said, said[-3000:]
            if args[0] == "submit":
                submitted = said
            if args[0] == "run":
                assert "channel live:" in said, said[-3000:]  # the trainer read the channel
            if args[:2] == ["handoff", "verify"]:
                clean = " 0 damaged, 0 missing commits, 0 orphan shards, 0 row count mismatches"
                assert clean in said
    finally:
        delete_topics(running_stack.kafka, topics("ctr").values())
    assert ran == ["services", "generate", "submit", "generate", "run", "handoff"]

    # Where the page says the checkpoints are, they are.
    s3 = S3Config.from_env(env)
    stage, trainer = re.findall(r"`(s3://flow/checkpoints/ctr/[^`]*)`", PRODUCTION.read_text())
    assert {"commits", "offsets", "state"} <= set(location(stage, s3).list(folders=True))
    assert trainer.endswith("/<model>-<settings>")
    assert location(trainer.rsplit("/", 1)[0], s3).list(folders=True)
    assert not (running_stack.home / "checkpoints" / "ctr").exists()

    # Spark's 200 shuffle partitions made this 2.5x slower on a cluster (spark_jobs.partitions):
    # one worker core gives Spark's minimum parallelism, 2, and a small input needs no more.
    assert "backfill: 2 shuffle partitions" in submitted, submitted[-3000:]
    local = tmp_path / "local"
    backfill = REPO / "pipelines" / "ctr_backfill.py"
    _job(["submit", "--master", "local[*]"], backfill, env, local, local, "--no-tracking")
    for name, value in env.items():  # the test's own reads of the page's S3 handoff
        if name.startswith(("FLOW_S3_", "AWS_")):
            monkeypatch.setenv(name, value)
    _assert_same_channel(str(local / "ctr"), f"{env['FLOW_HANDOFF']}/ctr", "backfill", 5000)
