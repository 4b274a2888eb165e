"""``flow run --train``: the trainer's configuration, its file and the channels it follows."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.training import load_config, parse_args
from flow.workflows.together import TrainerLaunch, following_the_job, result_file
from tests.support import Writer, stack_env_for


def test_the_trainer_follows_the_named_channels_of_its_namespace(tmp_path: Path) -> None:
    stack = StackConfig.from_env(stack_env_for(tmp_path))
    config = parse_args(["--namespace", "ctr", "--channel", "live", "--model", "deepfm"])
    launch = TrainerLaunch(config, 2, stack, "run-1")
    assert launch.channels == ["live"]
    assert launch.handoff == f"{stack.handoff}/ctr"
    assert launch.argv[-2:] == ["--config", str(launch.file)]
    assert "--nproc-per-node=2" in launch.argv
    given = load_config(launch.file)  # what the trainer will run: the user's, following
    assert given.follow
    assert given.parent_run_id == "run-1"
    assert given.wait_for_channels >= 600
    assert given.model.name == "deepfm"
    # Its whole result goes to a file beside its configuration: the terminal gets one line.
    assert given.result_file == result_file(stack, "run-1")
    assert given.result_file.parent == launch.file.parent
    assert given.handoff == launch.handoff
    assert given.checkpoint_dir is not None
    assert Path(given.checkpoint_dir).parent == Path(stack.checkpoints) / "ctr" / "trainer" / "live"
    Writer(launch.handoff, "live")
    launch.close_channels()
    assert (Path(launch.handoff) / "live" / "_closed").exists()


def test_a_trainer_without_channels_is_refused() -> None:
    with pytest.raises(ConfigError, match="--channel live"):
        parse_args(["--model", "dlrm"])


PIPELINE_FILE = """
from dataclasses import replace

from flow.pipeline import HandoffOutput, Pipeline
from pipelines.ctr_streaming import ctr_streaming


def shop_clicks() -> Pipeline:
    return replace(ctr_streaming("shop"), output=HandoffOutput(location="/data/handoff"))


if __name__ == "__main__":
    raise SystemExit("a pipeline file is loaded, not run, to find its namespace")
"""


def test_the_trainer_follows_the_namespace_of_the_pipeline_it_runs_beside(tmp_path: Path) -> None:
    app = tmp_path / "shop_clicks.py"
    app.write_text(PIPELINE_FILE)
    followed = following_the_job(parse_args(["--channel", "live"]), ["--conf", "x=1", str(app)])
    assert (followed.namespace, followed.handoff) == ("shop", "/data/handoff")
    # The namespace the job is given (pipelines/ctr_demo.py --namespace NS) is the one it writes.
    job = [str(app), "--namespace", "shop_eu"]
    assert following_the_job(parse_args(["--channel", "live"]), job).namespace == "shop_eu"
    # What the trainer was told wins.
    told = parse_args(["--channel", "live", "--namespace", "mine", "--handoff", "/h"])
    assert following_the_job(told, [str(app)]) == told
    # A script that is not a pipeline file is not run to find out.
    script = tmp_path / "job.py"
    script.write_text("raise SystemExit('a plain script must not run in the CLI')\n")
    plain = parse_args(["--channel", "live"])
    assert following_the_job(plain, [str(script)]) == plain


def test_a_pipeline_files_job_gets_the_connectors_of_its_sources_only(tmp_path: Path) -> None:
    from flow.workflows.together import pipeline_connectors

    app = tmp_path / "shop_clicks.py"
    app.write_text(PIPELINE_FILE)  # Kafka events, Iceberg tables
    assert pipeline_connectors(["--conf", "x=1", str(app), "--namespace", "eu"]) == frozenset(
        {"kafka"}
    )
    ratings = tmp_path / "my_ratings.py"
    ratings.write_text(
        "from pipelines.ratings import ratings\n\n\ndef my_ratings():\n    return ratings()\n"
    )
    assert pipeline_connectors([str(ratings)]) == frozenset()  # Iceberg only
    # A script flow cannot read a pipeline from keeps every connector, and is not run.
    script = tmp_path / "job.py"
    script.write_text("raise SystemExit('a plain script must not run in the CLI')\n")
    assert pipeline_connectors([str(script)]) is None


class _Tracker:
    """MlflowTracker's pipeline run, as the status it ends with."""

    ended: ClassVar[list[str]] = []

    def __init__(self, tracking_uri: str, experiment: str) -> None:
        pass

    @contextlib.contextmanager
    def pipeline_run(self, name: str, params: Any = None) -> Iterator[Any]:
        run = SimpleNamespace(run_id="p" * 32, log_metrics=lambda metrics: None)
        try:
            yield run
        except BaseException:
            self.ended.append("FAILED")
            raise
        self.ended.append("FINISHED")


@pytest.mark.parametrize(
    ("spark_code", "trainer_code", "status"),
    [(0, 0, "FINISHED"), (0, 5, "FAILED"), (3, 0, "FAILED")],
)
def test_run_together_says_how_both_ended_and_fails_their_run_when_one_failed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    spark_code: int,
    trainer_code: int,
    status: str,
) -> None:
    from flow.workflows import together

    monkeypatch.setattr(together, "MlflowTracker", _Tracker)
    _Tracker.ended.clear()
    stack = StackConfig.from_env(stack_env_for(tmp_path))
    trainer = [sys.executable, "-c", f"raise SystemExit({trainer_code})"]
    done = together.run_together(
        [str(tmp_path / "job.py")],
        parse_args(["--namespace", "ctr", "--channel", "live"]),
        1,
        stack,
        lambda argv, extra: spark_code,
        lambda said: None,
        start_trainer=lambda argv, env: subprocess.Popen(trainer),
    )
    assert (done.run_id, done.spark_code) == ("p" * 32, spark_code)
    assert done.code == (spark_code or trainer_code)
    if not spark_code:  # else the trainer was stopped, maybe before it ended of itself
        assert done.trainer_code == trainer_code
    assert done.trainer_result == result_file(stack, "p" * 32)
    assert _Tracker.ended == [status]
