"""What a training run reads, builds and records: one dataclass, filled from the command line."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from flow.config import StackConfig
from flow.errors import ConfigError
from trainers.models import ModelConfig
from trainers.optim import OptimConfig

__all__ = ["TrainConfig", "parse"]


def _weights(text: str) -> dict[str, float]:
    """``backfill=1,live=3`` -> {"backfill": 1.0, "live": 3.0}."""
    out: dict[str, float] = {}
    for part in filter(None, text.split(",")):
        name, sep, value = part.partition("=")
        if not sep:
            raise ConfigError(f"--mix {text!r}: write channel=weight pairs, e.g. backfill=1,live=3")
        out[name.strip()] = float(value)
    return out


@dataclass(frozen=True)
class TrainConfig:
    """A training run."""

    handoff: str
    """The handoff location (path or URI) holding the channels."""
    channels: tuple[str, ...]
    model: ModelConfig
    optim: OptimConfig = field(default_factory=OptimConfig)
    mix: dict[str, float] | None = None
    """Weights per channel; None with several channels reads them in order (priority)."""
    eval_channel: str | None = None
    """Held-out rows for AUC and log loss; without one, progressive validation only (each batch
    is scored before the model trains on it)."""
    batch_size: int = 4096
    window_batches: int = 16
    seed: int = 0
    epochs: int = 1
    max_steps: int | None = None
    follow: bool = False
    """Continuous mode: follow the channels' new commits until they are closed."""
    device: str = "auto"
    bf16: bool | None = None
    """Mixed precision (bf16 autocast); default on for CUDA, off on CPU."""
    compile: bool = False
    shuffle_on: str = "auto"
    """Where the window shuffle's gather runs: ``host`` (the reader), ``device`` (the GPU, from
    windows copied in order; the same batches), ``auto``: the device on CUDA, else the host."""
    reader_threads: int = 2
    """Threads per rank that read, check and decompress shards ahead of use."""
    log_every: int = 50
    eval_every: int | None = None
    eval_batches: int | None = None
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 500
    export_every: int | None = None
    """Continuous mode: log (and register) the model every this many steps."""
    consumer_group: str = "trainer"
    tracking: bool = True
    experiment: str = "trainer"
    parent_run_id: str | None = None
    register_as: str | None = None
    event_time: str | None = None
    """A timestamp column of the rows, for freshness (event -> training step)."""
    after_commit: int = -1
    """Read only the commits after this batch id (incremental retraining)."""
    holdout_share: float = 0.0
    """Hold this share of the buckets out of training and evaluate on them (when there is no
    eval channel): the same rows every run, since buckets are fixed per row."""
    init_from_champion: bool = False
    """Warm-start from the ``champion`` of ``register_as`` (when it has one)."""
    promote_margin: float | None = None
    """Promote the new model to ``champion`` only if its held-out AUC is not below the
    champion's by more than this; None: no promotion step."""
    wait_for_channels: float = 0.0
    """Seconds to wait for the channels to appear (a trainer started beside its Spark job)."""
    audit_dir: Path | None = None
    """Debugging: each rank writes a fingerprint of every row it trained on (rank-<r>.npy)."""

    def __post_init__(self) -> None:
        if not self.channels:
            raise ConfigError("name at least one channel to train on (--channel live)")
        if self.mix is not None and set(self.mix) != set(self.channels):
            raise ConfigError(
                f"--mix names {sorted(self.mix)} but the channels are {sorted(self.channels)}"
            )
        if self.batch_size < 2 or self.window_batches < 2:
            raise ConfigError("batch size and window (in batches) must be at least 2")
        if not 0 <= self.holdout_share < 1:
            raise ConfigError(f"--holdout-share {self.holdout_share}: give a share in [0, 1)")
        if (self.init_from_champion or self.promote_margin is not None) and not self.register_as:
            raise ConfigError("--init-from-champion and --promote-margin need --register-as NAME")
        if self.shuffle_on not in ("auto", "host", "device"):
            raise ConfigError(f"--shuffle-on {self.shuffle_on!r}: use auto, host or device")
        if self.reader_threads < 1:
            raise ConfigError(f"--reader-threads {self.reader_threads}: give 1 or more")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"--device {self.device!r}: use auto, cpu, cuda or cuda:N")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchrun ... -m trainers train",
        description="Train a CTR model on handoff channels (one process per rank).",
    )
    p.add_argument("--handoff", help="handoff location; default $FLOW_HANDOFF/<namespace>")
    p.add_argument("--namespace", default="default", help="pipeline namespace (default: default)")
    p.add_argument("--channel", action="append", required=True, help="channel to train on")
    p.add_argument("--mix", help="weights per channel, e.g. backfill=1,live=3")
    p.add_argument("--eval-channel")
    p.add_argument("--model", default="dlrm", choices=["deepfm", "dlrm", "wide_deep"])
    p.add_argument("--embedding-dim", type=int, default=16)
    p.add_argument("--hidden", default="256,128", help="MLP widths, comma-separated")
    p.add_argument("--max-embedding-rows", type=int, default=2**22)
    p.add_argument("--optimizer", default="adam", choices=["adam", "adagrad", "sgd"])
    p.add_argument("--embedding-optimizer", default="adam", choices=["adam", "adagrad", "sgd"])
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--embedding-lr", type=float)
    p.add_argument("--cowclip", action="store_true", help="CowClip embedding gradients")
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--window-batches", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int)
    p.add_argument("--follow", action="store_true", help="continuous: follow new commits")
    p.add_argument("--device", default="auto")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument(
        "--shuffle-on",
        default="auto",
        choices=["auto", "host", "device"],
        help="where the shuffle's gather runs (auto: the GPU on CUDA)",
    )
    p.add_argument("--reader-threads", type=int, default=2, help="shard-decoding threads")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--eval-every", type=int)
    p.add_argument("--eval-batches", type=int)
    p.add_argument("--checkpoint-dir", type=Path)
    p.add_argument("--checkpoint-every", type=int, default=500)
    p.add_argument("--export-every", type=int)
    p.add_argument("--consumer-group", default="trainer")
    p.add_argument("--no-tracking", action="store_true")
    p.add_argument("--experiment", default="trainer")
    p.add_argument("--parent-run-id", help="nest the trainer's runs under this MLflow run")
    p.add_argument("--register-as", help="register the model under this name")
    p.add_argument("--event-time", help="timestamp column, for event-to-training freshness")
    p.add_argument("--after-commit", type=int, default=-1, help="only commits after this id")
    p.add_argument("--holdout-share", type=float, default=0.0, help="buckets held out to evaluate")
    p.add_argument("--init-from-champion", action="store_true", help="warm-start from champion")
    p.add_argument("--promote-margin", type=float, help="promote if AUC >= champion's - margin")
    p.add_argument(
        "--wait-for-channels", type=float, default=0.0, help="seconds to wait for the channels"
    )
    p.add_argument("--audit-dir", type=Path, help="write per-rank fingerprints of rows trained on")
    p.add_argument("--result-file", type=Path, help="rank 0 writes the run's summary as JSON")
    return p


def parse(argv: list[str], stack: StackConfig | None = None) -> TrainConfig:
    args = parser().parse_args(argv)
    stack = stack or StackConfig.from_env()
    handoff = args.handoff or f"{stack.handoff.rstrip('/')}/{args.namespace}"
    checkpoints = args.checkpoint_dir or (
        stack.checkpoints / args.namespace / "trainer" / "-".join(args.channel)
    )
    hidden = tuple(int(w) for w in args.hidden.split(",") if w)
    return TrainConfig(
        handoff=handoff,
        channels=tuple(args.channel),
        model=ModelConfig(
            name=args.model,
            embedding_dim=args.embedding_dim,
            hidden=hidden,
            max_embedding_rows=args.max_embedding_rows,
        ),
        optim=OptimConfig(
            embedding=args.embedding_optimizer,
            dense=args.optimizer,
            lr=args.lr,
            embedding_lr=args.embedding_lr,
            cowclip=args.cowclip,
        ),
        mix=_weights(args.mix) if args.mix else None,
        eval_channel=args.eval_channel,
        batch_size=args.batch_size,
        window_batches=args.window_batches,
        seed=args.seed,
        epochs=args.epochs,
        max_steps=args.max_steps,
        follow=args.follow,
        device=args.device,
        bf16=args.bf16,
        compile=args.compile,
        shuffle_on=args.shuffle_on,
        reader_threads=args.reader_threads,
        log_every=args.log_every,
        eval_every=args.eval_every,
        eval_batches=args.eval_batches,
        checkpoint_dir=checkpoints,
        checkpoint_every=args.checkpoint_every,
        export_every=args.export_every,
        consumer_group=args.consumer_group,
        tracking=not args.no_tracking,
        experiment=args.experiment,
        parent_run_id=args.parent_run_id,
        register_as=args.register_as,
        event_time=args.event_time,
        audit_dir=args.audit_dir,
        wait_for_channels=args.wait_for_channels,
        after_commit=args.after_commit,
        holdout_share=args.holdout_share,
        init_from_champion=args.init_from_champion,
        promote_margin=args.promote_margin,
    )
