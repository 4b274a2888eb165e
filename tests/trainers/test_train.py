"""The training loop on real handoff channels (CPU, no tracking server)."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pytest
import torch

from flow.errors import ConfigError
from flow.handoff import Channel, World
from flow.handoff.audit import prove_channel, read_audit
from flow.training import ModelConfig, OptimConfig, TrainConfig, fingerprint
from tests.support import REPO
from tests.trainers.channels import write, write_delayed
from trainers import lazy
from trainers import train as train_module
from trainers.checkpoint import Checkpointer
from trainers.inputs import columns_of, layout_of, reader_for
from trainers.loader import DeviceLoader
from trainers.result import TrainResult
from trainers.session import OPTIONAL_COLUMNS, fingerprints
from trainers.train import train


def config(root: Path, **changes: object) -> TrainConfig:
    base: dict[str, object] = {
        "handoff": str(root),
        "channels": ("train",),
        "model": ModelConfig("dlrm", embedding_dim=8, hidden=(32, 16), bottom=(16,)),
        "optim": OptimConfig(lr=0.01),
        "batch_size": 128,
        "window_batches": 4,
        "device": "cpu",
        "tracking": False,
        "log_every": 10_000,
        "checkpoint_dir": root / "checkpoints",
        "checkpoint_every": 5,
    }
    given = base | changes
    if isinstance(given["checkpoint_dir"], Path):  # the setting is a path or a URI: a str
        given["checkpoint_dir"] = str(given["checkpoint_dir"])
    return TrainConfig(**given)  # type: ignore[arg-type]


def audit(folder: Path, rank: int = 0) -> np.ndarray:
    """The row ids (or, a channel without a key, fingerprints) rank ``rank`` read, in order."""
    ids: np.ndarray = read_audit(folder, rank).column("row_id").to_numpy()
    return ids


def test_training_learns_the_planted_signal_and_reports_it(tmp_path: Path) -> None:
    write(tmp_path, "train", [4000, 4000])
    write(tmp_path, "heldout", [3000], seed=99)
    cfg = config(
        tmp_path,
        eval_channel="heldout",
        epochs=2,
        batch_size=256,
        checkpoint_dir=None,
        event_time="event_time",
    )
    result = train(cfg, say=lambda _: None)
    assert result.rows == 2 * 8000
    assert result.metrics["auc"] > 0.75, result.metrics
    assert result.metrics["count"] == 3000
    assert 0 <= result.stall_fraction < 1
    assert result.freshness(0.5) is not None


def test_a_resumed_trainer_continues_with_exactly_the_next_rows(tmp_path: Path) -> None:
    write(tmp_path, "train", [3000, 2000])
    whole = tmp_path / "whole"
    train(config(tmp_path, audit_dir=whole, checkpoint_dir=tmp_path / "a"), say=lambda _: None)
    expected = audit(whole)
    # A trainer killed after step 17 restarts from its checkpoint of step 15 ...
    checkpoints = tmp_path / "b"
    first = tmp_path / "first"
    train(
        config(tmp_path, audit_dir=first, checkpoint_dir=checkpoints, max_steps=17),
        say=lambda _: None,
    )
    (checkpoints / "latest").write_text("15")
    second = tmp_path / "second"
    result = train(config(tmp_path, audit_dir=second, checkpoint_dir=checkpoints), say=print)
    assert result.resumed_from == 15
    trained = np.concatenate([audit(first)[: 15 * 128], audit(second)])
    assert np.array_equal(trained, expected)  # nothing skipped, nothing read twice


def test_a_checkpoint_of_another_model_or_settings_is_refused_naming_the_difference(
    tmp_path: Path,
) -> None:
    total = write(tmp_path, "train", [1000, 1000])
    train(config(tmp_path, max_steps=7), say=lambda _: None)
    deepfm = ModelConfig("deepfm", embedding_dim=8, hidden=(16,))
    with pytest.raises(ConfigError, match=r"model.name: 'dlrm' -> 'deepfm'.*--fresh"):
        train(config(tmp_path, model=deepfm), say=lambda _: None)
    with pytest.raises(ConfigError, match=r"optim.lr: 0.01 -> 0.02"):
        train(config(tmp_path, optim=OptimConfig(lr=0.02)), say=lambda _: None)
    again = train(config(tmp_path, model=deepfm, fresh=True), say=lambda _: None)
    assert again.resumed_from is None
    assert again.rows == total  # from scratch: every row, once


def test_a_finished_run_is_not_reported_again_and_more_epochs_go_on_from_it(
    tmp_path: Path,
) -> None:
    total = write(tmp_path, "train", [1000, 600])
    first = train(config(tmp_path), say=lambda _: None)
    assert first.rows == total
    with pytest.raises(ConfigError, match=r"has finished at step \d+: .*--epochs \(from one"):
        train(config(tmp_path), say=lambda _: None)
    # A second epoch by default adds an embedding L2: another run, refused in this folder ...
    with pytest.raises(ConfigError, match=r"embedding_weight_decay: 0.0 -> 0.0001"):
        train(config(tmp_path, epochs=2), say=lambda _: None)
    # ... and with the L2 it trained with kept, the same run goes on.
    same = OptimConfig(lr=0.01, embedding_weight_decay=0.0)
    more = train(config(tmp_path, epochs=2, optim=same), say=lambda _: None)
    assert more.resumed_from == first.steps
    assert more.rows == total  # the second epoch, and only it


def test_a_channel_written_again_is_not_resumed_from_its_old_cursor(tmp_path: Path) -> None:
    write(tmp_path, "train", [1000])
    train(config(tmp_path, max_steps=5), say=lambda _: None)
    shutil.rmtree(tmp_path / "train")  # removed, and written again
    write(tmp_path, "train", [1000], seed=3)
    with pytest.raises(ConfigError, match="channel train: written again"):
        train(config(tmp_path), say=lambda _: None)


def test_a_checkpoint_of_two_ranks_resumes_on_one_with_every_row_once(tmp_path: Path) -> None:
    """Two ranks stopped at step 8 (their batches taken by the trainer's own reader and loader,
    their cursors saved as its checkpointer does); one rank finishes the epoch."""
    write(tmp_path, "train", [3000, 2000])
    whole = tmp_path / "whole"
    train(config(tmp_path, audit_dir=whole, checkpoint_dir=tmp_path / "a"), say=lambda _: None)
    expected = audit(whole)  # one epoch: every row once
    checkpoints = tmp_path / "b"
    cfg = config(tmp_path, checkpoint_dir=checkpoints, max_steps=8)
    train(cfg, say=lambda _: None)  # a model and an optimizer as a checkpoint holds them
    state = torch.load(checkpoints / "step-000000000008" / "model.pt", weights_only=False)
    columns = columns_of(layout_of(cfg))
    read = []
    for rank in range(2):
        reader = reader_for(cfg, World(rank, 2), cfg.channels, train=True)
        loader = DeviceLoader(reader, torch.device("cpu"), columns, optional=OPTIONAL_COLUMNS)
        batches = list(itertools.islice(loader, 8))
        read += [fingerprints(b.tensors) for b in batches]
        Checkpointer(checkpoints, rank, world_size=2).save(8, state, batches[-1].cursor)
    second = tmp_path / "second"
    result = train(config(tmp_path, audit_dir=second, checkpoint_dir=checkpoints), say=print)
    assert result.resumed_from == 8
    trained = np.concatenate([*read, audit(second)])
    assert len(set(trained.tolist())) == len(trained), "a row trained on twice"
    assert np.array_equal(np.sort(trained), np.sort(expected))  # and none skipped


def test_a_channel_without_a_layout_is_refused_with_the_reason(tmp_path: Path) -> None:
    from tests.support import Writer

    Writer(tmp_path, "train").commit([10])
    with pytest.raises(ConfigError, match="records no feature layout"):
        train(config(tmp_path), say=lambda _: None)


@pytest.mark.slow
def test_two_ranks_under_torchrun_see_disjoint_equal_shares(tmp_path: Path) -> None:
    total = write(tmp_path, "train", [1500, 1100], buckets=4)
    audit_dir = tmp_path / "audit"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--standalone", "-m", "trainers", "train",
        "--handoff", str(tmp_path), "--channel", "train", "--batch-size", "100",
        "--window-batches", "4", "--device", "cpu", "--no-tracking", "--model", "deepfm",
        "--embedding-dim", "4", "--hidden", "8", "--audit-dir", str(audit_dir),
        "--checkpoint-dir", str(tmp_path / "ckpt"),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FLOW_HOME": str(tmp_path / "home")}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [audit(audit_dir, r) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == total // 2
    assert not set(ranks[0].tolist()) & set(ranks[1].tolist())
    assert len(set(ranks[0].tolist()) | set(ranks[1].tolist())) == total


def test_channels_read_in_order_open_when_reached_even_if_created_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = write(tmp_path, "backfill", [2000])
    Channel(str(tmp_path), "backfill").close()
    waited: list[float] = []

    def live_arrives(seconds: float) -> None:
        # The trainer has read the history and waits for "live": its producer starts now.
        waited.append(seconds)
        write(tmp_path, "live", [1000, 1000], seed=50)
        Channel(str(tmp_path), "live").close()

    monkeypatch.setattr(lazy, "pause", live_arrives)
    tracker = RecordingTracker()
    monkeypatch.setattr(train_module, "_tracker", lambda *_: tracker)
    cfg = config(tmp_path, channels=("backfill", "live"), follow=True, wait_for_channels=60)
    said: list[str] = []
    result = train(cfg, say=said.append)
    assert waited == [lazy.POLL_S]  # it waited for the live channel, once
    assert result.rows == history + 2000
    assert set(result.by_channel) == {"backfill", "live"}
    # Followed channels: the trainer's legs, measured per batch and per commit picked up.
    assert set(result.picked_up_to_trained_s) == {"backfill", "live"}
    assert result.committed_to_picked_up_s["live"].keys() == {0, 1}
    assert [rows for rows, _ in result.committed_to_picked_up_s["live"].values()] == [1000, 1000]
    assert all(s >= 0 for s in result.picked_up_to_trained_s["live"])
    run = tracker.runs["train"]
    logged = run.files["freshness_legs.json"]
    assert isinstance(logged, dict)
    assert [c[:2] for c in logged["live"]["commits"]] == [[0, 1000], [1, 1000]]
    assert len(logged["live"]["batches"]) == len(result.picked_up_to_trained_s["live"])
    assert "picked_up_to_trained_p99_s.live" in run.metrics
    assert any(line.startswith("freshness by leg, channel live: ") for line in said)


@pytest.mark.slow
@pytest.mark.faults
def test_a_trainer_killed_mid_run_continues_from_its_checkpoint_exactly(tmp_path: Path) -> None:
    # Rows with a key (the impression id), which the audit names them by.
    write_delayed(tmp_path, "train", "window", 80_000, oracle=False)
    whole = tmp_path / "whole"
    train(config(tmp_path, audit_dir=whole, checkpoint_dir=tmp_path / "a", batch_size=64,
                 model=ModelConfig("wide_deep", embedding_dim=4, hidden=(8,))),
          say=lambda _: None)  # fmt: skip
    expected = audit(whole)
    checkpoints, audited = tmp_path / "b", tmp_path / "audited"
    command = [
        sys.executable, "-m", "trainers", "train", "--handoff", str(tmp_path),
        "--channel", "train", "--batch-size", "64", "--window-batches", "4", "--device", "cpu",
        "--no-tracking", "--model", "wide_deep", "--embedding-dim", "4", "--hidden", "8",
        "--lr", "0.01", "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "5",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FLOW_HOME": str(tmp_path / "home")}
    command += ["--audit-dir", str(audited)]
    first = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (checkpoints / "latest").exists() or int((checkpoints / "latest").read_text()) < 20:
        assert first.poll() is None, "the trainer ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    first.kill()  # SIGKILL: no chance to save anything more
    first.wait()
    step = int((checkpoints / "latest").read_text())
    channel = Channel(str(tmp_path), "train")
    killed = prove_channel(channel, audited)  # the dead run's reads, from its audit alone
    assert killed.read >= step * 64, killed.lines()
    assert not killed.duplicates, killed.lines()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # The killed run's reads and the resumed run's: the uninterrupted run's rows, in its order.
    assert np.array_equal(audit(audited), expected)
    assert prove_channel(channel, audited).exactly_once


class RecordingRun:
    """A tracked run that keeps what it is given (params, tags, metrics with their steps)."""

    def __init__(self) -> None:
        self.run_id = "recorded"
        self.params: dict[str, object] = {}
        self.tags: dict[str, str] = {}
        self.metrics: dict[str, list[tuple[int | None, float]]] = {}
        self.files: dict[str, object] = {}

    def log_params(self, params: Mapping[str, object]) -> None:
        self.params.update(params)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        for key, value in metrics.items():
            self.metrics.setdefault(key, []).append((step, value))

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.tags.update(tags)

    def log_dict(self, data: object, artifact_file: str) -> None:
        self.files[artifact_file] = data


class RecordingTracker:
    def __init__(self) -> None:
        self.runs: dict[str, RecordingRun] = {}

    @contextlib.contextmanager
    def pipeline_run(
        self, name: str, params: object = None, tags: object = None
    ) -> Iterator[RecordingRun]:
        yield self.runs.setdefault(name, RecordingRun())

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[RecordingRun]:
        yield self.runs.setdefault(name, RecordingRun())


def test_delayed_feedback_is_corrected_on_immediate_channels_and_reported_honestly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Backfill labelled by window, then live rows labelled at once; evaluated on more live
    rows. FNW on live only (auto) against plain cross-entropy everywhere (off)."""
    backfill = write_delayed(tmp_path, "backfill", "window", 3_000, seed=3, oracle=False)
    live = write_delayed(tmp_path, "live", "immediate", 8_000, seed=1)
    write_delayed(tmp_path, "live_eval", "immediate", 5_000, seed=2)
    results: dict[str, TrainResult] = {}
    trackers: dict[str, RecordingTracker] = {}
    said: dict[str, list[str]] = {}
    for setting in ("auto", "off"):
        trackers[setting] = RecordingTracker()
        monkeypatch.setattr(train_module, "_tracker", lambda *_, t=trackers[setting]: t)
        lines: list[str] = []
        said[setting] = lines
        cfg = config(
            tmp_path,
            channels=("backfill", "live"),
            eval_channel="live_eval",
            delayed_feedback=setting,
            oracle="p_click",
            event_time="ts",
            epochs=2,
            batch_size=256,
            checkpoint_dir=None,
            model=ModelConfig("dlrm", embedding_dim=4, hidden=(16,), bottom=(8,)),
        )
        results[setting] = train(cfg, say=lines.append)
    fnw, plain = results["auto"], results["off"]

    # Which loss each channel got: said at the start, tagged, kept in the result.
    assert fnw.labels == {
        "backfill": {"strategy": "window", "correction": "none"},
        "live": {"strategy": "immediate", "correction": "fnw"},
    }
    assert plain.labels["live"] == {"strategy": "immediate", "correction": "none"}
    assert (
        "channel live: labels immediate, fake-negative weighted loss (FNW), AUC over impressions "
        "(key impression_id)" in said["auto"]
    )
    assert "channel backfill: labels window, plain BCE" in said["auto"]
    run = trackers["auto"].runs["train"]
    assert run.tags["flow.delayed_feedback.live"] == "fnw"
    assert run.tags["flow.delayed_feedback.backfill"] == "none"
    assert run.params["delayed_feedback"] == "auto"
    # Two epochs: the embedding tables get the several-pass L2 default, and the run says so.
    assert str(run.params["optim.embedding_weight_decay"]) == "0.0001"

    # Held-out live rows, counted per impression: FNW is calibrated, plain BCE predicts low.
    assert plain.metrics["calibration_corrected"] < 0.85
    assert abs(fnw.metrics["calibration_corrected"] - 1) < abs(
        plain.metrics["calibration_corrected"] - 1
    )
    assert fnw.by_pass["repeated"]["calibration_corrected"] == pytest.approx(1.0, abs=0.1)
    assert "oracle_auc" in fnw.metrics  # evaluation has the oracle too
    # Live rows are P/(N+P) positive; corrected, P/N.
    live_scores = fnw.by_channel["live"]
    assert live_scores["positive_rate_corrected"] > live_scores["positive_rate"]
    # Their AUC is over impressions (each clicked one's first prediction counts as a positive),
    # twice over in two epochs; the held-out channel's too.
    clicks = live - 8_000
    assert live_scores["auc_impressions"] == 2 * 8_000
    assert live_scores["auc_count"] == 2 * 8_000
    assert live_scores["count"] == 2 * (8_000 + clicks)
    assert fnw.metrics["auc_impressions"] == 5_000

    # The oracle over the same rows; the backfill has no such column: left out and counted.
    assert fnw.by_channel["live"]["oracle_count"] == 2 * live
    assert fnw.by_channel["backfill"]["oracle_missing"] == 2 * backfill
    assert "oracle_auc" not in fnw.by_channel["backfill"]

    # First-seen and repeated rows apart; windows of event time over first-seen rows.
    assert fnw.by_pass["first_seen"]["count"] == fnw.by_pass["repeated"]["count"] == live + backfill
    assert sum(w["count"] for w in fnw.by_window["live"].values()) == live
    assert set(fnw.by_window) == {"backfill", "live"}
    windows = run.metrics["window_progressive_auc.live"]
    assert sorted(int(step or 0) for step, _ in windows) == sorted(fnw.by_window["live"])

    # Produced -> trained only where rows say when they were produced (not the backfill).
    assert set(fnw.freshness_produced_s) == {"live"}
    assert set(fnw.freshness_s) == {"backfill", "live"}
    # ... and each batch's, in order, for where in the run the slow ones were.
    series = run.files["freshness_produced.json"]
    assert isinstance(series, dict)
    assert [lag for _, lag in series["live"]] == [
        round(lag, 2) for lag in fnw.freshness_produced_s["live"]
    ]
    times = [at for at, _ in series["live"]]
    assert times[0] == 0.0
    assert times == sorted(times)
    for name in (
        "freshness_produced_p50_s.live",
        "freshness_produced_p99_s.live",
        "run_progressive_first_seen_auc",
        "run_progressive_repeated_auc",
        "run_progressive_oracle_auc.live",
        "run_progressive_calibration_corrected.live",
    ):
        assert name in run.metrics, name
    summary = "\n".join(said["auto"])
    assert "channel live [labels immediate, loss fnw]" in summary
    assert "repeated rows (trained on before: not generalisation)" in summary
    assert "freshness produced -> trained, channel live" in summary


def test_a_model_frozen_after_the_backfill_scores_the_later_rows_beside_the_trained_one(
    tmp_path: Path,
) -> None:
    write_delayed(tmp_path, "backfill", "window", 2_000, seed=3, oracle=False)
    write_delayed(tmp_path, "live", "immediate", 3_000, seed=1, key_column=False)
    lines: list[str] = []
    cfg = config(
        tmp_path,
        channels=("backfill", "live"),
        frozen_after="backfill",
        batch_size=256,
        checkpoint_dir=None,
        model=ModelConfig("dlrm", embedding_dim=4, hidden=(16,), bottom=(8,)),
    )
    result = train(cfg, say=lines.append)
    assert "model frozen after channel backfill: later rows are also scored by it" in lines
    live = result.by_channel["live"]
    assert {"frozen_auc", "frozen_logloss"} <= set(live)
    assert 0.0 <= live["frozen_auc"] <= 1.0
    assert live["frozen_logloss"] != live["logloss"]  # another model scored the same rows
    assert "frozen_auc" not in result.by_channel["backfill"]  # it trained on those rows
    # Without the label key's column, an immediate channel can only be scored row by row.
    assert any("AUC over rows (pass the label join's key through" in line for line in lines)
    assert "auc_impressions" not in live


def test_the_identity_is_of_the_effective_settings(tmp_path: Path) -> None:
    # More than one epoch turns on the embedding L2 by default: another run, another identity;
    # the number of epochs itself is not (more of them goes on from a checkpoint).
    assert config(tmp_path, epochs=2).identity() != config(tmp_path, epochs=1).identity()
    assert config(tmp_path, epochs=2).identity() == config(tmp_path, epochs=3).identity()
    explicit = OptimConfig(lr=0.01, embedding_weight_decay=0.0)
    assert config(tmp_path, epochs=2, optim=explicit).identity() == config(tmp_path).identity()


def test_a_run_of_other_effective_settings_trains_in_its_own_folder_and_says_so(
    tmp_path: Path,
) -> None:
    write(tmp_path, "train", [1000, 1000])

    def named(**changes: object) -> TrainConfig:
        """The run in the folder its settings name, as TrainConfig.resolved() names it."""
        cfg = config(tmp_path, checkpoint_dir=None, **changes)
        folder = tmp_path / "checkpoints" / f"dlrm-{fingerprint(cfg.identity())}"
        return dataclasses.replace(cfg, checkpoint_dir=str(folder))

    one, several = named(), named(epochs=2)
    assert one.checkpoint_dir != several.checkpoint_dir
    train(one, say=lambda _: None)
    said: list[str] = []
    result = train(several, say=said.append)
    assert result.resumed_from is None
    assert any("none yet" in s and "1 run(s) of other settings beside it" in s for s in said), said


def _readme_torchrun() -> list[str]:
    """The README's torchrun line, as printed (its words after ``torchrun``)."""
    line = next(
        raw.strip()
        for raw in (REPO / "README.md").read_text().splitlines()
        if raw.strip().startswith(".venv/bin/torchrun ")
    )
    return line.split()[1:]


@pytest.mark.slow
def test_the_readme_torchrun_line_trains_after_a_finished_one_rank_run(tmp_path: Path) -> None:
    """A finished 1-rank run in the default checkpoint folder refused the README's 2-rank line
    ("has finished ... or --fresh", then torchrun's traceback): it is another run (another
    global batch), which now trains from scratch in its place and says so. The same number of
    ranks again is still refused: that run has nothing left to train."""
    home = tmp_path / "home"
    write(home / "handoff" / "ctr", "backfill", [1500, 1100], buckets=4)
    Channel(str(home / "handoff" / "ctr"), "backfill").close()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FLOW_HOME": str(home)}
    # No MLflow server here: the runs are untracked, on the CPU; nothing else is added.
    local = ["--no-tracking", "--device", "cpu"]
    words = _readme_torchrun()
    assert words[words.index("-m") + 1 :][:2] == ["trainers", "train"]
    one = [sys.executable, "-m", "trainers", *words[words.index("-m") + 2 :], *local]
    two = [sys.executable, "-m", "torch.distributed.run", *words, *local]

    def run(command: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False
        )

    first = run(one)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    second = run(two)
    said = second.stdout + second.stderr
    assert second.returncode == 0, said[-3000:]
    assert "Traceback" not in said
    assert re.search(r"finished at step \d+ on 1 rank\(s\)", said), said[-3000:]
    assert "2 rank(s) train another run from scratch" in said
    again = run(two)
    assert again.returncode == 1
    assert "has finished at step" in again.stdout + again.stderr
