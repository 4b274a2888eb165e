"""Helpers the test folders share (fixtures live in conftest.py files)."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import numpy as np
import pyarrow as pa

from flow.config import ENV_VARS
from flow.handoff import Channel, ChannelReader, Commit, ReadOptions

REPO = Path(__file__).resolve().parents[1]
FLOW_BIN = str(Path(sys.executable).with_name("flow"))


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on right now (held open together so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def clean_environ() -> dict[str, str]:
    """os.environ without any stack setting, so the developer's own exports cannot leak in."""
    return {k: v for k, v in os.environ.items() if k not in ENV_VARS}


SHORT_JOB_JVM = {"JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1"}
"""For the JVMs of the commands the tests run (``flow run``/``submit``'s drivers, a standalone
cluster's master, workers and executors): HotSpot's C1 compiler only. Those jobs are short and
small; with the full tiered JIT a subprocess test spent about a third more CPU compiling code it
ran a few times (docs/experiments/2026-11-29-ci-time.md). Not for the pytest process's own Spark
session, which runs hundreds of queries and got slower on C1, nor for the broker. The JIT changes
no result, only speed. An exported ``JAVA_TOOL_OPTIONS`` (even empty) is kept instead."""


def short_job_jvm() -> dict[str, str]:
    """:data:`SHORT_JOB_JVM`, unless ``JAVA_TOOL_OPTIONS`` is exported (then nothing: theirs)."""
    return {} if "JAVA_TOOL_OPTIONS" in os.environ else dict(SHORT_JOB_JVM)


def stack_env_for(home: Path) -> dict[str, str]:
    kafka, controller, mlflow = free_ports(3)
    return {
        "FLOW_HOME": str(home),
        "FLOW_JAR_CACHE": os.environ.get("FLOW_JAR_CACHE") or str(REPO / ".flow" / "jars"),
        "FLOW_KAFKA_PORT": str(kafka),
        "FLOW_KAFKA_CONTROLLER_PORT": str(controller),
        "FLOW_MLFLOW_PORT": str(mlflow),
        **short_job_jvm(),
    }


def run_flow(
    args: list[str], env: Mapping[str, str], timeout: float = 600, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """Run the ``flow`` command as a user would, with ``env`` as the stack settings."""
    return subprocess.run(
        [FLOW_BIN, *args],
        env={**clean_environ(), **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def handoff_rows(where: str, channel: str) -> pa.Table:
    """Every committed row of a handoff channel, read by one unshuffled rank."""
    reader = ChannelReader(where, channel, options=ReadOptions(batch_size=1024, shuffle=False))
    batches = list(reader)
    return (
        pa.Table.from_batches(batches, schema=reader.schema)
        if batches
        else reader.schema.empty_table()
    )


NUMBERED = pa.schema([("id", pa.int64()), ("x", pa.list_(pa.float32(), 3))])
"""Rows of the handoff tests: ``id`` numbers them, ``x`` repeats it (checks row integrity)."""


class Writer:
    """Writes channels the way Spark tasks and the driver do, with numbered rows."""

    def __init__(
        self,
        root: Path | str,
        name: str,
        buckets: int = 4,
        compression: str | None = "lz4",
        level: int | None = None,
        writer: str = "",
    ):
        self.channel = Channel(str(root), name)
        self.writer = writer
        self.channel.create(
            NUMBERED, num_buckets=buckets, compression=compression, compression_level=level
        )
        self.buckets = buckets
        self.next_id = 0
        self.batch = 0

    def commit(self, rows_per_shard: list[int]) -> list[int]:
        shards, ids = [], []
        for k, rows in enumerate(rows_per_shard):
            values = np.arange(self.next_id, self.next_id + rows, dtype=np.int64)
            ids.extend(values.tolist())
            self.next_id += rows
            x = np.repeat(values.astype(np.float32), 3)
            table = pa.table(
                {"id": values, "x": pa.FixedSizeListArray.from_arrays(pa.array(x), 3)},
                schema=NUMBERED,
            )
            shards.append(self.channel.write_bucket(self.batch, k % self.buckets, table, f"t{k}"))
        meta = self.channel.meta()
        self.channel.add_commit(
            Commit(
                self.channel.name, self.batch, tuple(shards), meta.fingerprint, writer=self.writer
            )
        )
        self.batch += 1
        return ids


def read_ids(reader: ChannelReader, limit: int | None = None) -> list[list[int]]:
    out = []
    for batch in reader:
        ids = batch.column("id").to_pylist()
        assert batch.column("x").flatten().to_pylist() == [float(i) for i in ids for _ in range(3)]
        out.append(ids)
        if limit is not None and len(out) >= limit:
            break
    return out


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """The ROC AUC of ``scores`` for boolean ``labels`` (from ranks; no ties expected)."""
    order = np.argsort(scores)
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    positives = labels.sum()
    return float(
        (ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * (~labels).sum())
    )


def doc_commands(doc: Path, heading: str) -> list[list[str]]:
    """The commands of the first ```bash block under ``heading`` in ``doc``, as a shell would
    split them: continuation lines joined, comments dropped, one entry per ``;``-separated
    command. A test that runs these cannot drift from what the page prints."""
    text = doc.read_text()
    start = text.index(f"\n{heading}\n")
    block = re.search(r"^```bash\n(.*?)^```", text[start:], re.MULTILINE | re.DOTALL)
    if block is None:
        raise ValueError(f"{doc.name}: no bash block under {heading!r}")
    joined = block.group(1).replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        for part in line.split(";"):
            words = shlex.split(part, comments=True)
            if words:
                commands.append(words)
    return commands


def flow_command(args: list[str]) -> tuple[click.Command, dict[str, Any]]:
    """The command ``flow ARGS`` runs and its parameters, through the real CLI's parsing
    (click's, with :func:`own_options_first` for the Spark commands): nothing runs."""
    from flow.cli import main  # here: most tests need none of the CLI

    command: click.Command = main
    context = click.Context(main, info_name="flow")
    rest = list(args)  # the page gives the group no options of its own (--debug)
    while isinstance(command, click.Group):
        name, found, rest = command.resolve_command(context, rest)
        assert found is not None, f"flow has no command {name!r}"
        command, context = found, click.Context(found, info_name=name, parent=context)
    return command, command.make_context(context.info_name, rest, parent=context.parent).params
