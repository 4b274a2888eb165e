"""The training loop: handoff batches -> CTR model -> checkpoints, metrics and MLflow.

    torchrun --nproc-per-node 2 -m trainers train --namespace ctr --channel backfill

One process per rank (torchrun sets RANK and WORLD_SIZE; gloo on CPU, NCCL on GPU). Every
rank reads its own buckets and gets the same number of batches, so DDP's collectives line up.
Checkpoints are taken at step counts (the same on every rank) and hold the model, the optimizer,
the step and each rank's reader cursor: a restarted trainer continues with the next batch.

Measured while training: samples/s, and the data-stall fraction, the time the loop waited for
its next batch over the whole step time. Rank 0 tracks a ``train`` and an ``evaluate`` run in
MLflow (nested under ``--parent-run-id`` when a pipeline run started the trainer); a tracking
outage is reported and retried, never fatal.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from flow.errors import ConfigError
from flow.handoff import Channel, ChannelReader, MixedReader, ReadOptions, World
from flow.pipeline.state import Layout
from flow.tracking import MlflowTracker, NullTracker, ResilientRun, Run, Tracker
from flow.training import TrainConfig
from trainers.checkpoint import Checkpointer
from trainers.lazy import LazyReader
from trainers.lineage import commits_read, lineage_tags
from trainers.loader import Batch, DeviceLoader, ShuffleOn, StallMeter
from trainers.metrics import BinaryMetrics
from trainers.models import CTRModel, build_model
from trainers.optim import CowClip, build_optimizer
from trainers.promote import Decision, champion_state, decide, load_champion, promote

__all__ = ["TrainResult", "train"]


@dataclass
class TrainResult:
    steps: int = 0
    rows: int = 0
    """Rows this rank trained on."""
    seconds: float = 0.0
    wait_seconds: float = 0.0
    resumed_from: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    """The last evaluation (or progressive validation) metrics."""
    freshness_s: dict[str, list[float]] = field(default_factory=dict)
    """Per channel, per batch: seconds from the rows' median event time to the step using them."""
    overall: dict[str, float] = field(default_factory=dict)
    """Progressive validation over the whole run (every batch scored before training on it)."""
    by_channel: dict[str, dict[str, float]] = field(default_factory=dict)
    """The same, per channel (e.g. how the model did on live rows it had not seen)."""
    run_id: str | None = None
    model_uri: str | None = None
    model_version: str | None = None
    decision: Decision | None = None
    """Whether the new model became the champion, and why (with --promote-margin)."""
    leader: bool = True
    """Rank 0: the rank that tracks, exports and reports."""
    world_size: int = 1

    @property
    def samples_per_s(self) -> float:
        """Over all ranks (each reads the same number of rows)."""
        return self.rows * self.world_size / self.seconds if self.seconds else 0.0

    @property
    def stall_fraction(self) -> float:
        return self.wait_seconds / self.seconds if self.seconds else 0.0

    def freshness(self, quantile: float, channel: str | None = None) -> float | None:
        """A quantile of event-to-training seconds, of one channel or all (None: no times)."""
        values = [
            v for name, found in self.freshness_s.items() if channel in (None, name) for v in found
        ]
        return float(np.quantile(values, quantile)) if values else None


def fingerprints(tensors: dict[str, torch.Tensor]) -> np.ndarray:
    """A 64-bit fingerprint per row of a batch (for audits: which rank saw which rows)."""
    parts = [tensors[k].reshape(len(tensors["label"]), -1) for k in sorted(tensors)]
    values = torch.cat([p.double().cpu() for p in parts], dim=1).numpy().view(np.uint64)
    mixers = np.random.default_rng(0).integers(1, 2**63, values.shape[1], dtype=np.uint64) | 1
    with np.errstate(over="ignore"):
        mixed: np.ndarray = (values * mixers).sum(axis=1, dtype=np.uint64)
    return mixed


def _device(choice: str) -> torch.device:
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible; use --device cpu")
    if choice == "cuda":  # torchrun's LOCAL_RANK picks this process's GPU
        choice = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    return torch.device(choice)


def _start_distributed(device: torch.device) -> World:
    world = World.from_env()
    if world.world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timedelta(minutes=10))
        if device.type == "cuda":
            torch.cuda.set_device(device)
    return world


def _reader(
    config: TrainConfig,
    world: World,
    channels: tuple[str, ...],
    *,
    train: bool,
    buckets: frozenset[int] | None = None,
) -> Any:
    options = ReadOptions(
        batch_size=config.batch_size,
        window_rows=config.batch_size * config.window_batches,
        shuffle=train,
        seed=config.seed,
        follow=config.follow and train,
        # Retention needs every bucket read: a reader of a subset records nothing.
        consumer_group=config.consumer_group if train and buckets is None else None,
        buckets=buckets,
        after_commit=config.after_commit,
        threads=config.reader_threads,
    )
    if len(channels) == 1:
        return ChannelReader(config.location, channels[0], world=world, options=options)
    if config.mix:
        readers = {
            c: ChannelReader(config.location, c, world=world, options=options) for c in channels
        }
        return MixedReader(readers, weights=config.mix, seed=config.seed)
    # In order: a later channel opens when the earlier ones are done, so a trainer can start on
    # the history while the live stage has not yet written its first commit.
    first = ChannelReader(config.location, channels[0], world=world, options=options)
    later = {
        c: LazyReader(
            config.location,
            c,
            world,
            options,
            config.wait_for_channels,
            first.channel.meta().layout,
        )
        for c in channels[1:]
    }
    return MixedReader({channels[0]: first, **later}, priority=list(channels), seed=config.seed)


def _holdout(config: TrainConfig) -> tuple[frozenset[int] | None, frozenset[int] | None]:
    """(held out, trained on): the first share of the buckets and the rest (rows hash to
    buckets, so this is a random slice, the same every run); (None, None) without a share."""
    if not config.holdout_share:
        return None, None
    total = ChannelReader(config.location, config.channels[0]).channel.meta().num_buckets
    held = frozenset(range(max(1, round(config.holdout_share * total))))
    return held, frozenset(range(total)) - held


def _needed_now(config: TrainConfig) -> tuple[str, ...]:
    """The channels a run needs before its first step: read in order, only the first."""
    return config.channels if config.mix or len(config.channels) == 1 else config.channels[:1]


def _wait_for(config: TrainConfig, say: Callable[[str], None]) -> None:
    """Until the channels exist (a writer creates one with its first batch), or time is up."""
    deadline = time.monotonic() + config.wait_for_channels
    said = False
    while True:
        missing = [c for c in _needed_now(config) if not Channel(config.location, c).exists()]
        if not missing or time.monotonic() >= deadline:
            return  # a channel still missing fails below, naming what exists
        if not said:
            say(f"waiting for channel(s) {', '.join(missing)} in {config.location}")
            said = True
        time.sleep(1.0)


def _layout(config: TrainConfig) -> Layout:
    """The feature layout the channels were written with (all of them must agree)."""
    layouts = {}
    for name in _needed_now(config):
        meta = ChannelReader(config.location, name).channel.meta()
        if not meta.layout:
            raise ConfigError(
                f"channel {name!r} in {config.location} records no feature layout: it was not "
                "written by a pipeline stage (write it with ExportOptions(layout=...))"
            )
        layouts[name] = meta.layout
    if len({str(v) for v in layouts.values()}) > 1:
        raise ConfigError(
            f"channels {sorted(layouts)} have different feature layouts; train on channels of "
            "one feature spec and feature state"
        )
    return Layout.from_dict(next(iter(layouts.values())))


def _columns(layout: Layout) -> list[str]:
    columns = ["label"]
    if layout.dense:
        columns.append("dense")
    if layout.sparse:
        columns.append("sparse")
    columns += [f"seq_{name}" for name, _, _ in layout.sequences]
    return columns


def _loss(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    labels = batch["label"].float()
    weight = batch.get("weight")
    return nn.functional.binary_cross_entropy_with_logits(
        logits.float(), labels, weight=weight.float() if weight is not None else None
    )


def evaluate(
    model: nn.Module,
    batches: Iterator[Batch],
    *,
    limit: int | None,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]],
) -> dict[str, float]:
    """AUC, log loss and calibration over ``batches`` (all ranks' predictions together)."""
    metrics = BinaryMetrics()
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for n, batch in enumerate(batches):
            if limit is not None and n >= limit:
                break
            with autocast():
                logits = model(batch.tensors)
            metrics.update(logits.float(), batch.tensors["label"], batch.tensors.get("weight"))
    model.train(was_training)
    return metrics.compute(distributed=dist.is_initialized())


class _Scores:
    """Progressive validation: every batch scored before the model trains on it.

    Predictions stay on the device until a log step: moving them to the host every step would
    make every step wait for the GPU, and the loader's copy-ahead would be for nothing.
    """

    def __init__(self) -> None:
        self.pending: list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
        self.progressive = BinaryMetrics(capacity=1_000_000)
        """Since the last log step."""
        self.overall = BinaryMetrics(capacity=2_000_000)
        self.by_channel: dict[str, BinaryMetrics] = {}

    def add(
        self, channel: str | None, logits: torch.Tensor, batch: dict[str, torch.Tensor]
    ) -> None:
        self.pending.append(
            (channel or "?", logits.detach().float(), batch["label"], batch.get("weight"))
        )

    def flush(self) -> None:
        for channel in dict.fromkeys(c for c, _, _, _ in self.pending):
            mine = [p for p in self.pending if p[0] == channel]
            logits = torch.cat([p[1] for p in mine])
            labels = torch.cat([p[2] for p in mine])
            given = [p[3] for p in mine if p[3] is not None]
            weights = torch.cat(given) if len(given) == len(mine) else None
            per_channel = self.by_channel.setdefault(channel, BinaryMetrics(capacity=1_000_000))
            for metrics in (self.progressive, self.overall, per_channel):
                metrics.update(logits, labels, weights)
        self.pending = []


class _Session:
    """One rank's run: model, optimizer, data, tracking; ``run()`` trains."""

    def __init__(
        self, config: TrainConfig, say: Callable[[str], None], tracking_uri: str | None
    ) -> None:
        self.config = config
        self.tracking_uri = tracking_uri
        self.device = _device(config.device)
        self.world = _start_distributed(self.device)
        self.leader = self.world.rank == 0
        self.say = say if self.leader else (lambda _: None)
        torch.manual_seed(config.seed)
        _wait_for(config, self.say)
        self.layout = _layout(config)
        self.model: CTRModel = build_model(config.model, self.layout).to(self.device)
        self.optimizer = build_optimizer(self.model, config.optim)
        self.clip = CowClip.from_config(config.optim)
        self.net: nn.Module = self.model
        if self.world.world_size > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.net = DistributedDataParallel(self.model, device_ids=ids)
        if config.compile:
            self.net = torch.compile(self.net)  # type: ignore[assignment]
        bf16 = config.bf16 if config.bf16 is not None else self.device.type == "cuda"
        self.bf16 = bf16
        self.shuffle_on: ShuffleOn = (
            ("device" if self.device.type == "cuda" else "host")
            if config.shuffle_on == "auto"
            else "device"
            if config.shuffle_on == "device"
            else "host"
        )
        self.holdout, kept = _holdout(config)
        self.reader = _reader(config, self.world, config.channels, train=True, buckets=kept)
        self.champion: CTRModel | None = None
        if config.init_from_champion or config.promote_margin is not None:
            self.champion = self._champion(warm_start=config.init_from_champion)
        self.columns = _columns(self.layout)
        self.checkpoints = (
            Checkpointer(config.checkpoint_dir, self.world.rank, self.world.world_size)
            if config.checkpoint_dir
            else None
        )
        self.step = 0
        self.last_cursor: dict[str, Any] | None = None
        """The reader's cursor after the last batch trained on (lineage reads it)."""

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "model_config": asdict(self.config.model),
            "layout": self.layout.to_dict(),
        }

    def resume(self) -> int | None:
        found = self.checkpoints.load() if self.checkpoints else None
        if found is None:
            return None
        state, cursor = found
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.reader.load_state_dict(cursor)
        self.step = int(state["step"])
        self.say(f"resumed from the checkpoint of step {self.step}")
        return self.step

    def _champion(self, *, warm_start: bool) -> CTRModel | None:
        """The registered champion (for comparison), loaded into this run's model if asked."""
        assert self.config.register_as is not None  # checked by TrainConfig
        saved = champion_state(self.config.register_as, self.tracking_uri)
        if saved is None:
            self.say(f"{self.config.register_as} has no champion yet: training from scratch")
            return None
        champion = load_champion(saved, self.layout).to(self.device)
        if warm_start:
            self.model.load_state_dict(champion.state_dict())
            self.say(f"warm start from {self.config.register_as} version {saved['version']}")
        return champion

    def evaluate(self, model: nn.Module | None = None) -> dict[str, float]:
        """AUC and log loss on the eval channel, or on the held-out buckets; {} without either."""
        config = self.config
        if config.eval_channel:
            reader = _reader(config, self.world, (config.eval_channel,), train=False)
        elif self.holdout is not None:
            reader = _reader(config, self.world, config.channels, train=False, buckets=self.holdout)
        else:
            return {}
        loader = DeviceLoader(reader, self.device, self.columns, shuffle_on=self.shuffle_on)
        return evaluate(
            model or self.net, iter(loader), limit=config.eval_batches, autocast=self.autocast
        )

    def _epochs_left(self) -> bool:
        # Following reads the channels once, until their producer closes them.
        epochs = 1 if self.config.follow else self.config.epochs
        return int(self.reader.epoch) < epochs

    def run(self, run: Run, result: TrainResult) -> None:
        config = self.config
        loader = DeviceLoader(
            self.reader,
            self.device,
            self.columns,
            event_time=config.event_time,
            shuffle_on=self.shuffle_on,
        )
        scores = _Scores()
        scored: dict[str, float] = {}  # the last progressive validation reported
        window_rows = 0.0
        window_stall, stall = StallMeter(), StallMeter()
        window_started = time.perf_counter()
        started = time.perf_counter()
        last_cursor: dict[str, Any] | None = None
        audit: list[np.ndarray] = []
        done = False
        while not done and self._epochs_left():
            for batch in loader:
                tensors = batch.tensors
                with self.autocast():
                    logits = self.net(tensors)
                loss = _loss(logits, tensors)
                scores.add(batch.channel, logits, tensors)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()  # type: ignore[no-untyped-call]
                if self.clip is not None:
                    self.clip.apply(self.model, tensors)
                self.optimizer.step()
                self.step += 1
                last_cursor = batch.cursor
                if config.audit_dir is not None:
                    audit.append(fingerprints(tensors))
                result.rows += batch.rows
                stall.add(batch)
                window_rows += batch.rows
                window_stall.add(batch)
                if batch.event_time_us is not None and len(batch.event_time_us):
                    event = float(np.median(batch.event_time_us.numpy())) / 1e6
                    lag = time.time() - event
                    result.freshness_s.setdefault(batch.channel or "?", []).append(lag)
                if self.step % config.log_every == 0:
                    elapsed = time.perf_counter() - window_started
                    scores.flush()
                    scored = scores.progressive.compute()
                    metrics = {
                        "loss": float(loss.detach()),
                        "samples_per_s": window_rows * self.world.world_size / elapsed,
                        "data_stall_fraction": window_stall.total() / elapsed,
                        **{f"progressive_{k}": v for k, v in scored.items()},
                    }
                    run.log_metrics(metrics, step=self.step)
                    self.say(
                        f"step {self.step}: loss {metrics['loss']:.4f}, "
                        f"{metrics['samples_per_s']:,.0f} samples/s, "
                        f"stall {metrics['data_stall_fraction']:.1%}"
                    )
                    scores.progressive.reset()
                    window_rows = 0.0
                    window_stall = StallMeter()
                    window_started = time.perf_counter()
                if config.eval_every and self.step % config.eval_every == 0:
                    evaluated = self.evaluate()
                    run.log_metrics({f"eval_{k}": v for k, v in evaluated.items()}, step=self.step)
                if self.checkpoints and self.step % config.checkpoint_every == 0:
                    self.checkpoints.save(self.step, self.state(), batch.cursor)
                if config.export_every and self.step % config.export_every == 0 and self.leader:
                    result.model_uri = export_model(self, run, final=False)[0]
                if config.max_steps is not None and self.step >= config.max_steps:
                    done = True
                    break
        result.wait_seconds = stall.total()
        result.seconds = time.perf_counter() - started
        result.steps = self.step
        self.last_cursor = last_cursor
        scores.flush()
        result.overall = scores.overall.compute() if scores.overall.count else {}
        result.by_channel = {n: m.compute() for n, m in scores.by_channel.items() if m.count}
        if config.audit_dir is not None:
            config.audit_dir.mkdir(parents=True, exist_ok=True)
            rows = np.concatenate(audit) if audit else np.empty(0, dtype=np.uint64)
            np.save(config.audit_dir / f"rank-{self.world.rank}-step-{self.step}.npy", rows)
        if self.checkpoints and last_cursor is not None:
            self.checkpoints.save(self.step, self.state(), last_cursor)
        if scores.progressive.count:
            scored = scores.progressive.compute()
        result.metrics = result.metrics or {f"progressive_{k}": v for k, v in scored.items()}


def export_model(session: _Session, run: Run, *, final: bool) -> tuple[str, str | None]:
    """Log the model to MLflow (pyfunc, with a signature) and register it when asked: its URI
    and registry version."""
    from trainers.export import log_model

    return log_model(
        session.model,
        session.layout,
        run.run_id,
        tracking_uri=session.tracking_uri,
        register_as=session.config.register_as if final else None,
    )


def _tracker(config: TrainConfig, tracking_uri: str | None) -> Tracker:
    if not config.tracking or tracking_uri is None:
        return NullTracker()
    return MlflowTracker(tracking_uri, config.experiment)


def train(
    config: TrainConfig,
    *,
    tracking_uri: str | None = None,
    say: Callable[[str], None] = print,
) -> TrainResult:
    """Train on ``config``'s channels; every rank calls this. Rank 0 tracks and exports."""
    session = _Session(config, say, tracking_uri)
    result = TrainResult(leader=session.leader, world_size=session.world.world_size)
    tracker = _tracker(config, tracking_uri if session.leader else None)
    parent = (
        tracker.attach(config.parent_run_id)
        if config.parent_run_id and isinstance(tracker, MlflowTracker)
        else tracker.pipeline_run("trainer", params={"channels": ",".join(config.channels)})
    )
    with parent, tracker.stage("train") as stage:
        run = ResilientRun(stage, session.say)
        run.log_params(_params(config, session))
        result.resumed_from = session.resume()
        session.run(run, result)
        result.run_id = stage.run_id
        final = {
            "samples_per_s": result.samples_per_s,
            "data_stall_fraction": result.stall_fraction,
            "steps": result.steps,
            "rows": result.rows,
            **{f"run_progressive_{k}": v for k, v in result.overall.items()},
        }
        for channel, scores in result.by_channel.items():
            final |= {f"run_progressive_{k}.{channel}": v for k, v in scores.items()}
        for channel in result.freshness_s:
            for q in (0.5, 0.99):
                final[f"freshness_p{round(q * 100)}_s.{channel}"] = (
                    result.freshness(q, channel) or 0
                )
        run.log_metrics(final, step=result.steps)
        if session.leader and session.last_cursor is not None:
            _log_lineage(session, run, session.last_cursor)
        if session.leader and config.tracking and tracking_uri:
            run.flush()
            result.model_uri, result.model_version = export_model(session, stage, final=True)
        with tracker.stage("evaluate") as evaluation:
            scores = session.evaluate()
            if scores:
                result.metrics = scores
                ResilientRun(evaluation, session.say).log_metrics(scores, step=result.steps)
            if config.promote_margin is not None:
                result.decision = _promotion(session, result, scores, [run, evaluation])
    if dist.is_initialized():
        dist.barrier()
    return result


def _promotion(
    session: _Session, result: TrainResult, scores: dict[str, float], runs: list[Any]
) -> Decision:
    """Champion or not: every rank evaluates (collectives), rank 0 decides and records."""
    assert session.config.promote_margin is not None
    assert session.config.register_as
    old = session.evaluate(session.champion) if session.champion is not None else None
    decision = decide(scores, old, session.config.promote_margin)
    if not session.leader:
        return decision
    if decision.promote and result.model_version is not None:
        promote(session.config.register_as, result.model_version, session.tracking_uri)
    outcome = "promoted" if decision.promote and result.model_version else "kept"
    for run in runs:
        run.set_tags({"flow.promotion": outcome, "flow.promotion.reason": decision.reason})
    if old is not None:
        runs[-1].log_metrics({f"champion_{k}": v for k, v in old.items()}, step=result.steps)
    session.say(f"{session.config.register_as}: {outcome} ({decision.reason})")
    return decision


def _log_lineage(session: _Session, run: Run, cursor: dict[str, Any]) -> None:
    """The commits read, their sources as tags, the rows' schema and layout as artifacts."""
    config = session.config
    commits = commits_read(config.location, config.channels, cursor)
    run.log_dict(commits, "handoff_commits.json")
    run.set_tags(lineage_tags(commits))
    reader = ChannelReader(config.location, config.channels[0])
    run.log_dict({f.name: str(f.type) for f in reader.schema}, "schema.json")
    run.log_dict(session.layout.to_dict(), "layout.json")
    read = [c for entries in commits.values() for c in entries]
    run.log_metrics(
        {"handoff_commits": len(read), "handoff_bytes": sum(c["bytes"] for c in read)},
        step=session.step,
    )


def _params(config: TrainConfig, session: _Session) -> dict[str, Any]:
    return {
        "handoff": config.location,
        "channels": ",".join(config.channels),
        "mix": config.mix,
        "model": config.model.name,
        **{f"model.{k}": v for k, v in asdict(config.model).items()},
        **{f"optim.{k}": v for k, v in asdict(config.optim).items()},
        "batch_size": config.batch_size,
        "world_size": session.world.world_size,
        "device": str(session.device),
        "bf16": session.bf16,
        "compile": config.compile,
        "shuffle_on": session.shuffle_on,
        "reader_threads": config.reader_threads,
        "parameters": sum(p.numel() for p in session.model.parameters()),
    }
