"""A Spark job and its trainer side by side: ``flow run --train "..." pipelines/APP.py``.

The Spark job writes channels while the trainer (``torchrun -m trainers train``, one process
per rank, started through ``trainers.launch`` so that stopping it prints one line) follows
them. Both nest their MLflow runs under one parent run made here (FLOW_PARENT_RUN_ID). When the
Spark job ends, the channels the trainer follows are closed, so it reads what is left and ends
cleanly; the command's exit code is the worse of the two.
"""

from __future__ import annotations

import ast
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from flow.config import StackConfig
from flow.handoff.channel import Channel
from flow.secrets import redact_argv
from flow.terminal import Start, inherit
from flow.tracking import PARENT_RUN_ENV, MlflowTracker
from flow.training import TrainConfig, save_config

__all__ = [
    "Together", "TrainerLaunch", "following_the_job", "pipeline_connectors", "result_file",
    "run_together",
]  # fmt: skip

FOLLOW_WAIT_S = 600.0
"""How long the trainer waits for a channel its Spark job has not created yet."""


def result_file(stack: StackConfig, parent_run: str) -> Path:
    """Where the trainer of pipeline run ``parent_run`` writes its whole result (JSON)."""
    return stack.home / "runs" / parent_run / "trainer-result.json"


class TrainerLaunch:
    """The trainer of a pipeline run: its configuration (following the channels, nested under
    the run), the file that holds it, and the command that starts it from that file.

    Its whole result goes to :func:`result_file` unless it was given a file: the trainer then
    prints one line that names the file, where it would print 28,000 characters of JSON."""

    def __init__(
        self, config: TrainConfig, processes: int, stack: StackConfig, parent_run: str
    ) -> None:
        self.config = replace(
            config,
            follow=True,
            wait_for_channels=max(config.wait_for_channels, FOLLOW_WAIT_S),
            parent_run_id=parent_run,
            result_file=config.result_file or result_file(stack, parent_run),
        ).resolved(stack)
        self.channels: list[str] = list(self.config.channels)
        self.handoff: str = self.config.location
        self.file: Path = save_config(
            self.config, stack.home / "runs" / parent_run / "trainer.json"
        )
        rendezvous = ["--standalone", f"--nproc-per-node={processes}"]
        self.argv = [
            sys.executable, "-m", "trainers.launch", *rendezvous,
            "-m", "trainers", "train", "--config", str(self.file),
        ]  # fmt: skip

    def close_channels(self) -> None:
        for name in self.channels:
            channel = Channel(self.handoff, name)
            if channel.exists():
                channel.close()


def following_the_job(config: TrainConfig, spark_argv: Sequence[str]) -> TrainConfig:
    """``config`` reading where the job's pipeline writes, unless the trainer was given its own
    ``--namespace``: the namespace the job is given (``APP.py --namespace NS``, as the
    pipelines here take it), else the pipeline file's own, with its handoff location (unless
    given ``--handoff``). A job that is not a pipeline file leaves ``config`` as it is."""
    from flow.errors import ConfigError
    from flow.pipeline.model import HandoffOutput
    from flow.workflows.retrain import load_pipeline

    app = _app(spark_argv)
    if app is None or config.namespace != TrainConfig.namespace:
        return config
    given = _option(spark_argv[app + 1 :], "--namespace")
    if not _defines_pipeline(spark_argv[app]):
        return config if given is None else replace(config, namespace=given)
    try:
        pipeline = load_pipeline(spark_argv[app])
    except (ConfigError, ImportError, SyntaxError):
        return config  # the Spark job reports what is wrong with its file
    output = pipeline.output
    handoff = config.handoff
    if handoff is None and isinstance(output, HandoffOutput):
        handoff = output.location
    return replace(config, namespace=given or pipeline.namespace, handoff=handoff)


def pipeline_connectors(spark_argv: Sequence[str]) -> frozenset[str] | None:
    """The Spark connectors (flow.engine.CONNECTORS) the job's pipeline needs, so that its
    driver starts without the others' jars; None (all of them) for a job that is not a pipeline
    file, or one that does not build (the Spark job then reports what is wrong with it)."""
    from flow.errors import ConfigError
    from flow.workflows.retrain import load_pipeline

    app = _app(spark_argv)
    if app is None or not _defines_pipeline(spark_argv[app]):
        return None
    try:
        return load_pipeline(spark_argv[app]).connectors()
    except (ConfigError, ImportError, SyntaxError):
        return None


def _app(spark_argv: Sequence[str]) -> int | None:
    """Where the application file is in a spark-submit command line (None: none given)."""
    return next((i for i, a in enumerate(spark_argv) if a.endswith(".py")), None)


def _option(argv: Sequence[str], name: str) -> str | None:
    """The value of ``name`` in ``argv`` (``--name V`` or ``--name=V``), the last one given."""
    found = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith(f"{name}="):
            found = arg.split("=", 1)[1]
    return found


def _defines_pipeline(app: str) -> bool:
    """Whether ``app`` defines a function named like the file (as pipeline files do, for
    load_pipeline): only such a file is run here, so a script that works when imported is not
    started twice."""
    path = Path(app)
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return False
    return any(isinstance(n, ast.FunctionDef) and n.name == path.stem for n in tree.body)


@dataclass(frozen=True)
class Together:
    """How a Spark job and its trainer ended, under one MLflow run."""

    run_id: str
    """The MLflow run both nested under."""
    spark_code: int
    trainer_code: int
    trainer_result: Path | None
    """Where the trainer wrote its whole result (JSON: its MLflow run, steps, metrics)."""

    @property
    def code(self) -> int:
        """The command's exit code: the worse of the two, the Spark job's first."""
        return self.spark_code or self.trainer_code


class _PartFailedError(Exception):
    """Raised inside the parent run when a part failed, so that the run ends as FAILED."""

    def __init__(self, done: Together) -> None:
        super().__init__(done.code)
        self.done = done


def run_together(
    spark_argv: Sequence[str],
    trainer_config: TrainConfig,
    processes: int,
    stack: StackConfig,
    launch_spark: Callable[[Sequence[str], dict[str, str]], int],
    say: Callable[[str], None],
    experiment: str | None = None,
    start_trainer: Start = inherit,
) -> Together:
    """Start the trainer, run the Spark job, close the channels, wait for the trainer; how both
    ended (a failure of either also ends the MLflow run they nested under as FAILED).

    The trainer reads where the job's pipeline writes unless told (:func:`following_the_job`);
    ``start_trainer`` starts its process (default: writing to this one's terminal).
    """
    trainer_config = following_the_job(trainer_config, spark_argv)
    found = _app(spark_argv)
    app = spark_argv[found] if found is not None else "pipeline"
    tracker = MlflowTracker(stack.mlflow.tracking_uri, experiment or f"pipeline-{Path(app).stem}")
    command = shlex.join(redact_argv(spark_argv))
    try:
        with tracker.pipeline_run(Path(app).stem, params={"command": command}) as run:
            trainer = TrainerLaunch(trainer_config, processes, stack, run.run_id)
            say(f"trainer: {shlex.join(redact_argv(trainer.argv[2:]))}")
            env = {**os.environ, PARENT_RUN_ENV: run.run_id}
            process = start_trainer(trainer.argv, env)
            try:
                spark_code = launch_spark(spark_argv, {PARENT_RUN_ENV: run.run_id})
                if spark_code:
                    # The channels will not be finished: a trainer left to follow them would
                    # wait for commits that never come.
                    say(f"the Spark job failed (exit {spark_code}); stopping the trainer")
                    trainer_code = _stop(process)
                else:
                    say(f"Spark job ended; closing {', '.join(trainer.channels)}")
                    trainer.close_channels()
                    trainer_code = process.wait()
            except BaseException:
                _stop(process)
                raise
            run.log_metrics({"spark_exit_code": spark_code, "trainer_exit_code": trainer_code})
            done = Together(run.run_id, spark_code, trainer_code, trainer.config.result_file)
            if done.code:
                raise _PartFailedError(done)
    except _PartFailedError as failed:
        return failed.done
    return done


def _stop(process: subprocess.Popen[bytes], grace_s: float = 60.0) -> int:
    """Ask the trainer to stop (SIGTERM: torchrun passes it to every rank, whose rank 0 says
    where it stopped in one line), then make it."""
    process.terminate()
    try:
        return process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()
