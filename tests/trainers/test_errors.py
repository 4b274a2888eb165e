"""``python -m trainers train`` reports a mistake in one line (exit 1), its traceback with
--debug; a checkpoint folder it cannot write is found before anything is read or built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flow.errors import ConfigError
from flow.training import TrainConfig
from tests.support import REPO, clean_environ, stack_env_for
from trainers.train import train


def trainer(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    return subprocess.run(
        [sys.executable, "-m", "trainers", "train", "--channel", "live", *args],
        env={**clean_environ(), **stack_env_for(tmp_path), "PYTHONPATH": path, **env},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_an_unknown_setting_is_one_line_and_exit_1_and_debug_shows_the_traceback(
    tmp_path: Path,
) -> None:
    done = trainer(tmp_path, FLOW_HANDOF="/tmp")
    assert done.returncode == 1
    assert done.stderr.startswith("error: unknown setting(s) FLOW_HANDOF; Primus Flow reads: ")
    assert len(done.stderr.splitlines()) == 1, done.stderr
    debug = trainer(tmp_path, "--debug", FLOW_HANDOF="/tmp")
    assert debug.returncode == 1
    assert debug.stderr.startswith("Traceback (most recent call last):")
    assert debug.stderr.splitlines()[-1].startswith("error: unknown setting(s) FLOW_HANDOF")


def test_a_missing_channel_is_one_line(tmp_path: Path) -> None:
    done = trainer(tmp_path, "--handoff", str(tmp_path / "nowhere"), "--no-tracking")
    assert done.returncode == 1
    assert done.stderr.startswith("error: handoff location ")
    assert len(done.stderr.splitlines()) == 1, done.stderr


def test_an_unwritable_checkpoint_folder_is_refused_before_reading(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a folder under a file cannot be made, even by root
    # No channel exists either: the checkpoint folder is checked before waiting for one.
    cfg = TrainConfig(
        channels=("train",),
        handoff=str(tmp_path / "no-handoff"),
        device="cpu",
        tracking=False,
        checkpoint_dir=str(blocker / "ckpt"),
    )
    with pytest.raises(ConfigError, match=rf"^--checkpoint-dir: cannot write to {blocker}/ckpt"):
        train(cfg, say=lambda _: None)


def test_the_headline_is_one_short_line_and_the_result_goes_to_its_file(tmp_path: Path) -> None:
    from trainers.__main__ import headline
    from trainers.result import TrainResult

    result = TrainResult(steps=120, rows=122_880, seconds=2.0, run_id="f" * 32)
    result.metrics["run_progressive_auc"] = 0.7312
    result.freshness_s["live"] = [1.0] * 10_000  # what made the old line 28,000 characters
    said = headline(result, tmp_path / "trainer.json")
    assert said == (
        f"trainer: done, 120 steps, 122,880 rows, {result.samples_per_s:,.0f} samples/s, "
        f"progressive_auc 0.7312; MLflow run {'f' * 32}; the whole result in "
        f"{tmp_path / 'trainer.json'}"
    )
    # With evaluation rows, their AUC of the model the run keeps (early stopping's best).
    result.metrics["auc"], result.best_step = 0.7088, 80
    assert "120 steps, 122,880 rows" in headline(result, None)
    assert "eval AUC 0.7088 (the model of step 80)" in headline(result, None)
