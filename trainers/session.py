"""One rank's training run: set-up, resumption, the step loop in named phases, evaluation.

:class:`Session` owns the model, the optimizer, the readers and the checkpoints of one rank;
``run()`` trains: each step is ``_step`` (forward, backward, CowClip, optimizer), ``_account``
(rows, waits, freshness, audit) and ``_after_step`` (the log line, evaluation, checkpoint and
export that fall due), then ``_finish`` records the run's figures. ``trainers.train.train``
wraps a session in its MLflow runs.

The loss of a batch depends on how its channel was labelled (``trainers.feedback``): the
session looks each channel's label strategy up once, when it first trains on it (a channel
read later may not exist when the run starts), and says which loss it uses.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.handoff import Channel
from flow.handoff.audit import AuditWriter, key_row_ids
from flow.storage import Location, setting_location
from flow.tracking import Run
from flow.training import TrainConfig, fingerprint, location_settings, with_batch_size
from trainers.checkpoint import Checkpointer, differences
from trainers.data import NO_TIME
from trainers.early_stop import EarlyStop
from trainers.feedback import Correction, Labels, labels_for, training_loss
from trainers.graphed import GraphedStep
from trainers.inputs import (
    columns_of,
    device_for,
    features_of,
    holdout,
    layout_of,
    reader_for,
    start_distributed,
    wait_for,
)
from trainers.lifecycle import FolderInUseError, Launcher, Lease
from trainers.loader import Batch, DeviceLoader, ShuffleOn, StallMeter
from trainers.metrics import Scores
from trainers.models import CTRModel, build_model
from trainers.optim import CowClip, build_optimizer
from trainers.progressive import ProgressiveScores
from trainers.promote import champion_state, load_champion
from trainers.result import TrainResult

__all__ = [
    "OPTIONAL_COLUMNS",
    "Exported",
    "Session",
    "TrainResult",
    "evaluate",
    "export_model",
    "fingerprints",
]

OPTIONAL_COLUMNS = ("weight",)
"""Tensor columns a batch has where its channel wrote them: the row weight of the loss."""


def fingerprints(tensors: dict[str, torch.Tensor]) -> np.ndarray:
    """A 64-bit fingerprint per row of a batch (for audits: which rank saw which rows)."""
    parts = [tensors[k].reshape(len(tensors["label"]), -1) for k in sorted(tensors)]
    values = torch.cat([p.double().cpu() for p in parts], dim=1).numpy().view(np.uint64)
    mixers = np.random.default_rng(0).integers(1, 2**63, values.shape[1], dtype=np.uint64) | 1
    with np.errstate(over="ignore"):
        mixed: np.ndarray = (values * mixers).sum(axis=1, dtype=np.uint64)
    return mixed


def _audit(audit: AuditWriter, batch: Batch) -> None:
    """The batch's rows by id: their key and label where the channel has a key column, else
    (no identity to prove) a fingerprint of their values."""
    if batch.keys is None:
        audit.id_kind = "fingerprint"
        audit.add(fingerprints(batch.tensors), batch.channel or "?")
        return
    labels = batch.tensors["label"].detach().double().cpu().numpy()
    audit.add(key_row_ids(batch.keys, labels), batch.channel or "?")


def _median_time(times_us: np.ndarray | None) -> float | None:
    """The median of a batch's known times, in seconds since the epoch (None: none known)."""
    if times_us is None:
        return None
    known = times_us[times_us != NO_TIME]
    return float(np.median(known)) / 1e6 if len(known) else None


def evaluate(
    model: nn.Module,
    batches: Iterator[Batch],
    *,
    limit: int | None,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]],
    immediate: Callable[[str | None], bool] = lambda _: False,
    oracle: bool = False,
) -> dict[str, float]:
    """AUC, log loss and calibration over ``batches`` (all ranks' predictions together);
    corrected figures for rows of ``immediate`` channels, the oracle's with ``oracle``."""
    metrics = Scores(10_000_000, oracle=oracle)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for n, batch in enumerate(batches):
            if limit is not None and n >= limit:
                break
            with autocast():
                logits = model(batch.tensors)
            metrics.update(
                logits.float(),
                batch.tensors["label"],
                batch.tensors.get("weight"),
                immediate=immediate(batch.channel),
                oracle=batch.oracle,
                keys=batch.keys,
            )
    model.train(was_training)
    return metrics.compute(distributed=dist.is_initialized())


class Session:
    """One rank's run: model, optimizer, data, tracking; ``run()`` trains."""

    def __init__(
        self,
        config: TrainConfig,
        say: Callable[[str], None],
        tracking_uri: str | None,
        *,
        on_evaluation: Callable[[dict[str, float]], bool] | None = None,
    ) -> None:
        self.config = config
        self.on_evaluation = on_evaluation
        """Called with each evaluation's figures while training (every rank alike, so they must
        answer alike); True stops the run there: ``flow tune``'s pruner (``result.pruned``)."""
        self.tracking_uri = tracking_uri
        # First: a rank whose launcher dies while it waits for its peers must not stay behind.
        self.launcher = Launcher.of_this_rank()
        self.device = device_for(config.device)
        self.world = start_distributed(self.device)
        self.leader = self.world.rank == 0
        self.say = say if self.leader else (lambda _: None)
        # Each probe names the setting that chose its location (a default checkpoint folder
        # is not --checkpoint-dir's), and the handoff goes first: the default checkpoints sit
        # beside it, often in its bucket, and a missing bucket is the handoff setting's fault.
        handoff, checkpoints = location_settings(config, StackConfig.from_env())
        self.default_folder = checkpoints != "--checkpoint-dir"
        """Whether the checkpoint folder is the one the settings name, not one the user gave."""
        # Before waiting for channels: an unreachable store is an error, not a channel to wait for.
        setting_location(config.location, handoff).check_readable(handoff)
        self.checkpoints = (
            Checkpointer(
                setting_location(config.checkpoint_dir, checkpoints),
                self.world.rank,
                self.world.world_size,
            )
            if config.checkpoint_dir
            else None
        )
        self.lease: Lease | None = None
        if self.checkpoints is not None:
            self.checkpoints.check_writable(checkpoints)  # before building anything
            self.lease = self._take_lease(self.checkpoints)
        try:
            self._build(config)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Let the checkpoint folder go (another trainer may use it from now on)."""
        if self.lease is not None:
            self.lease.release()

    def _take_lease(self, checkpoints: Checkpointer) -> Lease | None:
        """Rank 0 leases the checkpoint folder; every rank raises its refusal (the ranks of one
        run never refuse each other)."""
        lease, refused = None, None
        if self.leader:
            try:
                lease = Lease.take(checkpoints.folder)
            except FolderInUseError as exc:
                refused = str(exc)
        if self.world.world_size > 1:
            said = [refused]
            dist.broadcast_object_list(said, src=0)
            refused = said[0]
        if refused is not None:
            raise FolderInUseError(refused)
        return lease

    def _build(self, config: TrainConfig) -> None:
        """Everything after the checkpoint folder is held: model, optimizer, readers."""
        if self.checkpoints is not None and config.fresh:
            self.checkpoints.clear()
        torch.manual_seed(config.seed)
        wait_for(config, self.say)
        config, derived = with_batch_size(config)  # the channels exist now: their rows are known
        self.config = config
        if derived:
            self.say(derived)
        if config.epochs is None and config.effective_epochs > 1:
            self.say(
                f"epochs: up to {config.effective_epochs}, early stopping on the held-out rows "
                f"chooses (patience {config.effective_early_stop}); --epochs N sets them"
            )
        self.layout = layout_of(config)
        self.model: CTRModel = build_model(config.model, self.layout).to(self.device)
        if config.cuda_graph and (self.device.type != "cuda" or self.world.world_size > 1):
            raise ConfigError(
                f"--cuda-graph runs on one CUDA device, not {self.device} with "
                f"{self.world.world_size} rank(s); leave it off here"
            )
        self.optimizer = build_optimizer(
            self.model, config.effective_optim, capturable=config.cuda_graph
        )
        self._graphs: dict[tuple[str, tuple[str, ...]], GraphedStep[tuple[torch.Tensor, ...]]] = {}
        """The captured steps of ``--cuda-graph``, by loss correction and batch columns."""
        self.clip = CowClip.from_config(config.optim)
        patience = config.effective_early_stop
        self.early = (
            EarlyStop(
                patience,
                config.early_stop_on,
                self.checkpoints.folder if self.checkpoints else None,
                writer=self.leader,
            )
            if patience
            else None
        )
        """Early stopping on the evaluation rows (``--early-stop``), or None."""
        self.net: nn.Module = self.model
        self.frozen: nn.Module | None = None
        """The model as it was when ``frozen_after``'s rows ended (see _frozen_for)."""
        self.seen_frozen_channel = False
        if self.world.world_size > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            # Dynamic tables agree on every rank by construction (each learns every rank's
            # ids): broadcasting their mappings and sketches each step would only cost time.
            dynamic = any(e.kind == "dynamic" for e in config.model.embeddings)
            self.net = DistributedDataParallel(
                self.model, device_ids=ids, broadcast_buffers=not dynamic
            )
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
        self.holdout, self.kept = holdout(config)
        """The buckets held out for evaluation and those trained on (None, None: no share)."""
        self.reader = self._train_reader()
        self.champion: CTRModel | None = None
        if config.init_from_champion or config.promote_margin is not None:
            self.champion = self._champion(warm_start=config.init_from_champion)
        self.columns = columns_of(self.layout)
        # Dynamic tables that expire by event time read the step's times.
        self.columns += sorted(
            {
                e.time_column
                for e in config.model.embeddings
                if e.kind == "dynamic" and e.ttl_unit == "seconds"
            }
            - set(self.columns)
        )
        self.labels: dict[str, Labels] = {}
        """Per channel seen: how its rows were labelled and the loss used on them."""
        self.row_keys: dict[str, str | None] = {}
        """Auditing: each channel's row key column (its metadata's label key), read once."""
        self.step = 0
        self.run_id: str | None = None
        """The MLflow run tracking this training run (recorded in its checkpoints)."""
        self.finished = False
        """The run read all it was to read (a stop at ``max_steps`` is not finished)."""
        self.last_cursor: dict[str, Any] | None = None
        """The reader's cursor after the last batch trained on (lineage reads it)."""

    def _train_reader(self) -> Any:
        """A reader of the training channels from their start, for this rank."""
        return reader_for(
            self.config, self.world, self.config.channels, train=True, buckets=self.kept
        )

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.bf16:
            # A CUDA graph must not read casts cached outside it (trainers/graphed.py).
            return torch.autocast(
                self.device.type, dtype=torch.bfloat16, cache_enabled=not self.config.cuda_graph
            )
        return contextlib.nullcontext()

    def state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "model_config": asdict(self.config.model),
            "finished": self.finished,
            "run_id": self.run_id,
            "early_stop": self.early.state_dict() if self.early else None,
            **self._belongs_to(),
        }

    def _belongs_to(self) -> dict[str, Any]:
        """What makes a checkpoint this run's: its settings, the channels (as created) and the
        feature layout."""
        location = self.config.location
        channels = {
            name: Channel(location, name).meta().created_at
            for name in self.config.channels
            if Channel(location, name).exists()
        }
        identity = self.config.identity()
        return {"identity": identity, "channels": channels, "layout": self.layout.to_dict()}

    def resume(self) -> int | None:
        """Continue from the latest checkpoint of this run, if any: one with other settings or
        data, or one with nothing left to train, is refused, naming what differs."""
        if self.checkpoints is None:
            return None
        folder = self.checkpoints.folder
        found = self.checkpoints.load()
        if found is None:
            self.say(f"checkpoints: {folder} (none yet: training from the start{self._others()})")
            return None
        state, cursor = found
        differ = differences(state, self._belongs_to())
        if differ:
            raise ConfigError(
                f"the checkpoint of step {state['step']} in {folder} belongs to another run: "
                + "; ".join(differ)
                + ". Give another --checkpoint-dir, or --fresh to discard it and train from "
                "scratch"
            )
        self.reader.load_state_dict(cursor)
        self.step = int(state["step"])
        if self._replaces_finished_run(state, folder):
            return None
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.early is not None and state.get("early_stop"):
            self.early.load_state_dict(state["early_stop"])
        self._check_left(state, folder)
        self.say(f"resumed from the checkpoint of step {self.step} in {folder}")
        return self.step

    def _others(self) -> str:
        """``; N run(s) of other settings beside it`` when the checkpoint folder is the default
        one named by the settings and has siblings of the same model: a user who changed a
        setting sees why nothing was resumed."""
        if self.checkpoints is None:
            return ""
        folder = self.checkpoints.folder
        model = f"{self.config.model.name}-"
        if folder.name != model + fingerprint(self.config.identity()):
            return ""  # a folder the user named
        try:
            names = folder.parent().list(folders=True)
        except OSError:
            return ""
        others = sorted(n for n in names if n.startswith(model) and n != folder.name)
        if not others:
            return ""
        return (
            f"; {len(others)} run(s) of other settings beside it, e.g. {others[0]}: settings "
            "that change the run, defaults included, train in a folder of their own"
        )

    def _left(self) -> bool:
        """Whether these settings leave something to train after the step resumed from."""
        steps = self.config.max_steps
        return self._epochs_left() and (steps is None or self.step < steps)

    def _replaces_finished_run(self, state: dict[str, Any], folder: Location) -> bool:
        """In the folder the settings name, a finished run of another number of ranks is
        another run (the global batch differs): this one trains from scratch and replaces its
        checkpoints, saying so, where it used to be refused. Elastic resume is unchanged: an
        unfinished run is resumed on any number of ranks (a torchrun restarted after losing a
        node has to find it), and a folder the user named is never replaced."""
        assert self.checkpoints is not None
        ranks = self.checkpoints.loaded_from_ranks
        if not self.default_folder or ranks in (None, self.world.world_size) or self._left():
            return False
        tracked = state.get("run_id") not in (None, "untracked")
        kept = f"its model: MLflow run {state['run_id']}" if tracked else "it was not tracked"
        self.say(
            f"checkpoints: the run in {folder} finished at step {self.step} on {ranks} rank(s) "
            f"({kept}); {self.world.world_size} rank(s) train another run from scratch, whose "
            "checkpoints replace it"
        )
        if dist.is_initialized():
            dist.barrier()  # every rank has read the old checkpoint before it goes
        self.checkpoints.clear()
        self.reader = self._train_reader()
        self.step = 0
        return True

    def _check_left(self, state: dict[str, Any], folder: Location) -> None:
        """Refuse to resume a run with nothing left to read (its epochs, or the channels it
        followed until they closed): it would train on nothing and report the finished run's
        model as a new result."""
        early = self.early
        if early is not None and early.stopped and early.best is not None:
            raise ConfigError(
                f"the run in {folder} stopped early at step {self.step}: its evaluation "
                f"{early.on} has not improved on step {early.best.step}'s "
                f"({early.best.value:.4f}) for {early.stale} evaluations. Give a larger "
                "--early-stop to go on from it, or --fresh to train again from scratch"
            )
        if not self._left():
            tracked = state.get("run_id") not in (None, "untracked")
            run = f" (its results: MLflow run {state['run_id']})" if tracked else ""
            # From one pass to several, the default embedding L2 changes the run (identity):
            # going on from it needs that default kept.
            keep = (
                " (from one epoch to more, with --optim.embedding-weight-decay 0, the L2 it "
                "trained with)"
                if self.config.effective_epochs == 1
                and not self.config.follow
                and self.config.optim.embedding_weight_decay is None
                else ""
            )
            raise ConfigError(
                f"the run in {folder} has finished at step {self.step}{run}: these settings "
                f"leave nothing to train. Give more --epochs{keep} or --max-steps to go on from "
                "it, or --fresh to train again from scratch"
            )

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
            reader = reader_for(config, self.world, (config.eval_channel,), train=False)
        elif self.holdout is not None:
            reader = reader_for(
                config, self.world, config.channels, train=False, buckets=self.holdout
            )
        else:
            return {}
        loader = DeviceLoader(
            reader,
            self.device,
            self.columns,
            optional=OPTIONAL_COLUMNS,
            oracle=config.oracle,
            key=lambda channel: self.labels_of(channel).key,
            shuffle_on=self.shuffle_on,
        )
        return evaluate(
            model or self.net,
            iter(loader),
            limit=config.eval_batches,
            autocast=self.autocast,
            immediate=lambda channel: self.labels_of(channel).immediate,
            oracle=config.oracle is not None,
        )

    def labels_of(self, channel: str | None) -> Labels:
        """How ``channel``'s rows were labelled (its metadata, read once) and the loss used."""
        name = channel or self.config.channels[0]
        found = self.labels.get(name)
        if found is None:
            meta = Channel(self.config.location, name).meta()
            key = (meta.labels or {}).get("key")
            found = self.labels[name] = labels_for(
                self.config.delayed_feedback,
                meta.label_strategy,
                name,
                key if key in meta.schema.names else None,
            )
        return found

    def _announce(self, channel: str | None, run: Run, result: TrainResult) -> Labels:
        """The channel's labels; the first time, say (and tag the run with) the loss used."""
        name = channel or self.config.channels[0]
        if name in result.labels:
            return self.labels[name]
        labels = self.labels_of(name)
        result.labels[name] = {"strategy": labels.strategy, "correction": labels.correction}
        run.set_tags(
            {
                f"flow.delayed_feedback.{name}": labels.correction,
                f"flow.label_strategy.{name}": labels.strategy,
            }
        )
        warning = (
            " (its labels are final: FNW over-predicts there; --delayed-feedback auto applies "
            "it to immediate channels only)"
            if labels.correction == "fnw" and not labels.immediate
            else ""
        )
        self.say(f"channel {name}: {labels.describe()}{warning}")
        return labels

    def _epochs_left(self) -> bool:
        # Following reads the channels once, until their producer closes them.
        return int(self.reader.epoch) < self.config.effective_epochs

    def run(self, run: Run, result: TrainResult) -> None:
        """Train until the epochs, the followed channels or ``max_steps`` are done."""
        config = self.config
        loop = _Loop(
            scores=ProgressiveScores(
                oracle=config.oracle is not None,
                window_s=config.metrics_window_s if config.event_time else 0.0,
            ),
            audit=None
            if config.audit_dir is None
            # A run resumed from a checkpoint supersedes the audit of the steps after it.
            else AuditWriter(config.audit_dir, self.world.rank, resumed_from=self.step or None),
        )
        for channel in config.channels:  # those read later are announced at their first batch
            if Channel(config.location, channel).exists():
                self._announce(channel, run, result)
        started = time.perf_counter()
        while not loop.done and self._epochs_left():
            for batch in self._loader():
                labels = self._announce(batch.channel, run, result)
                loss = self._step(batch, labels, loop.scores)
                self._account(batch, result, loop)
                if self._after_step(run, result, loss, batch.cursor, loop):
                    loop.done = True  # max_steps reached, or stopped early
                    break
            if not loop.done and self.early is not None and not config.eval_every:
                loop.done = self._judge(run, loop, result)  # epochs chosen by the evaluation rows
        if self.early is not None and not self.early.stopped and loop.judged != self.step:
            self._judge(run, loop, None)  # the last model is a candidate too
        self._finish(result, loop, time.perf_counter() - started)
        self._restore_best(result)

    def _loader(self) -> DeviceLoader:
        return DeviceLoader(
            self.reader,
            self.device,
            self.columns,
            optional=OPTIONAL_COLUMNS,
            event_time=self.config.event_time,
            produced_time=self.config.produced_time,
            oracle=self.config.oracle,
            key=self._row_key,
            shuffle_on=self.shuffle_on,
        )

    def _row_key(self, channel: str | None) -> str | None:
        """The key column the training batches carry hashed: an immediate channel's label key
        (its metrics tie rows to impressions by it); auditing, any channel's, which names its
        rows in the audit (the metrics use keys of immediate channels only)."""
        key = self.labels_of(channel).key
        if key is not None or self.config.audit_dir is None:
            return key
        name = channel or self.config.channels[0]
        if name not in self.row_keys:
            meta = Channel(self.config.location, name).meta()
            found = (meta.labels or {}).get("key")
            self.row_keys[name] = found if found in meta.schema.names else None
        return self.row_keys[name]

    def _step(self, batch: Batch, labels: Labels, scores: ProgressiveScores) -> torch.Tensor:
        """One optimizer step on ``batch``, scored first (progressive validation); its loss."""
        tensors = batch.tensors
        frozen = self._frozen_for(batch.channel)
        if frozen is not None:
            with torch.no_grad(), self.autocast():
                scores.add_frozen(
                    batch.channel,
                    frozen(tensors),
                    tensors,
                    immediate=labels.immediate,
                    keys=batch.keys,
                )
        # The logits are the forward's, before the optimizer moved the weights.
        loss, logits = self._update(tensors, labels)
        scores.add(
            batch.channel,
            logits,
            tensors,
            immediate=labels.immediate,
            repeated=batch.epoch > 0,
            oracle=batch.oracle,
            event_time_us=batch.event_time_us,
            keys=batch.keys,
        )
        self.step += 1
        return loss

    def _update(
        self, tensors: dict[str, torch.Tensor], labels: Labels
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward, loss, backward and optimizer step: eagerly, or replayed as a CUDA graph
        (``--cuda-graph``; one graph per loss and set of columns, as channels differ in both).
        The loss and the logits (detached) are the caller's to keep."""
        if not self.config.cuda_graph:
            return self._forward_backward(tensors, labels.correction)
        key = (labels.correction, tuple(sorted(tensors)))
        graphed = self._graphs.get(key)
        if graphed is None:
            graphed = self._graphs[key] = GraphedStep(
                functools.partial(self._forward_backward, correction=labels.correction),
                self.device,
            )
        loss, logits = graphed(tensors)
        return loss.clone(), logits.clone()  # the graph's buffers: the next replay rewrites them

    def _forward_backward(
        self, tensors: Mapping[str, torch.Tensor], correction: Correction
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with self.autocast():
            logits = self.net(tensors)
        loss = training_loss(logits, dict(tensors), correction)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        if self.clip is not None:
            self.clip.apply(self.model, tensors)
        # Rows a dynamic table gave to new ids in this forward start without optimizer state.
        self.model.reset_new_rows(self.optimizer)
        self.optimizer.step()
        return loss.detach(), logits.detach()

    def _frozen_for(self, channel: str | None) -> nn.Module | None:
        """The copy of the model frozen once ``frozen_after``'s rows ended (made at the first
        batch of another channel after them), or None."""
        after = self.config.frozen_after
        if after is None:
            return None
        if channel == after:
            self.seen_frozen_channel = True
        elif self.frozen is None and self.seen_frozen_channel:
            self.frozen = copy.deepcopy(self.model).eval().requires_grad_(False)
            self.say(f"model frozen after channel {after}: later rows are also scored by it")
        return self.frozen

    def _account(self, batch: Batch, result: TrainResult, loop: _Loop) -> None:
        """Rows, waits, freshness and (when auditing) the ids of a batch's rows."""
        loop.cursor = batch.cursor
        if loop.audit is not None:
            _audit(loop.audit, batch)
        result.rows += batch.rows
        loop.stall.add(batch)
        loop.window.rows += batch.rows
        loop.window.stall.add(batch)
        now = time.time()
        event, produced = _median_time(batch.event_time_us), _median_time(batch.produced_us)
        if event is not None:
            result.freshness_s.setdefault(batch.channel or "?", []).append(now - event)
        if produced is not None:
            result.freshness_produced_s.setdefault(batch.channel or "?", []).append(now - produced)
            result.freshness_produced_at.setdefault(batch.channel or "?", []).append(now)
        if batch.origin is not None:  # a followed channel: the trainer's legs, measured
            result.add_origin(batch.channel or "?", batch.origin, now)

    def _after_step(
        self, run: Run, result: TrainResult, loss: torch.Tensor, cursor: dict[str, Any], loop: _Loop
    ) -> bool:
        """What falls due at this step: a log line, an evaluation, a checkpoint, an export.
        True when the run is to stop here (``max_steps``)."""
        config, step = self.config, self.step
        if step % config.log_every == 0:
            self._log(run, loss, loop)
        if config.eval_every and step % config.eval_every == 0:
            if self.early is not None:
                if self._judge(run, loop, result):
                    return True
            else:
                evaluated = self.evaluate()
                run.log_metrics({f"eval_{k}": v for k, v in evaluated.items()}, step=step)
                if self._pruned(evaluated, result):
                    return True
        if step % config.checkpoint_every == 0:
            self.launcher.check()  # an orphaned rank writes nothing
            # The audit's part first: a crash between the two leaves a part past the step the
            # next run resumes from, which the audit leaves out, never a gap.
            if loop.audit is not None:
                loop.audit.flush(step)
            if self.checkpoints:
                self.checkpoints.save(step, self.state(), cursor)
        if config.export_every and step % config.export_every == 0 and self.leader:
            result.model_uri = export_model(self, run, final=False).uri
        return config.max_steps is not None and step >= config.max_steps

    def _judge(self, run: Run, loop: _Loop, result: TrainResult | None) -> bool:
        """Evaluate now for early stopping, log it; True when the run is to stop. ``result``:
        the run may still stop here, and ``on_evaluation`` is asked (None: the run is over)."""
        assert self.early is not None
        evaluated = self.evaluate()
        run.log_metrics({f"eval_{k}": v for k, v in evaluated.items()}, step=self.step)
        loop.judged = self.step
        stop = self.early.update(self.step, evaluated, self.model)
        best = self.early.best
        # One line an evaluation: the figures early stopping chooses by, where one reads them.
        self.say(
            f"evaluation at step {self.step}: AUC {evaluated.get('auc', math.nan):.4f}, "
            f"log loss {evaluated.get('logloss', math.nan):.4f}"
            + (
                f"; the best so far: step {best.step}, {self.early.on} {best.value:.4f}"
                if best is not None
                else ""
            )
        )
        if result is not None and not stop and self._pruned(evaluated, result):
            return True
        if stop and best is not None:
            self.say(
                f"early stop at step {self.step}: evaluation {self.early.on} has not improved on "
                f"step {best.step}'s ({best.value:.4f}) for {self.early.stale} evaluations"
            )
        return stop

    def _pruned(self, evaluated: dict[str, float], result: TrainResult) -> bool:
        """Whether ``on_evaluation`` stops the run at this evaluation (and says so)."""
        if self.on_evaluation is None or not self.on_evaluation(evaluated):
            return False
        result.pruned = True
        self.say(f"stopped at step {self.step}: the evaluation's watcher pruned the run")
        return True

    def _restore_best(self, result: TrainResult) -> None:
        """With early stopping, the best model evaluated is the run's model from here on."""
        if self.early is None:
            return
        best = self.early.restore(self.model)
        result.stopped_early = self.early.stopped
        if best is None:
            self.say("early stopping: no evaluation gave a figure; keeping the last model")
            return
        result.best_step = best.step
        if best.step != self.step:
            self.say(
                f"early stopping: the model of step {best.step} is the run's model "
                f"(evaluation {self.early.on} {best.value:.4f}); trained to step {self.step}"
            )

    def _log(self, run: Run, loss: torch.Tensor, loop: _Loop) -> None:
        """Metrics of the steps since the last log line (the only host-device sync a step has)."""
        window = loop.window
        elapsed = time.perf_counter() - window.started
        loop.scores.flush()
        loop.scored = loop.scores.progressive.compute()
        metrics = {
            "loss": float(loss.detach()),
            "samples_per_s": window.rows * self.world.world_size / elapsed,
            "data_stall_fraction": window.stall.total() / elapsed,
            **{f"progressive_{k}": v for k, v in loop.scored.items()},
        }
        run.log_metrics(metrics, step=self.step)
        self.say(
            f"step {self.step}: loss {metrics['loss']:.4f}, "
            f"{metrics['samples_per_s']:,.0f} samples/s, "
            f"stall {metrics['data_stall_fraction']:.1%}"
        )
        loop.scores.progressive.reset()
        loop.window = _Window()

    def _finish(self, result: TrainResult, loop: _Loop, seconds: float) -> None:
        """The run's figures, the audit file and the last checkpoint."""
        result.wait_seconds = loop.stall.total()
        result.seconds = seconds
        result.steps = self.step
        self.last_cursor = loop.cursor
        loop.scores.flush()
        scores = loop.scores
        result.overall = scores.overall.compute() if scores.overall.count else {}
        result.by_channel = {n: m.compute() for n, m in scores.by_channel.items() if m.count}
        for channel, frozen in scores.frozen.items():
            if frozen.count and channel in result.by_channel:
                figures = frozen.compute()
                result.by_channel[channel] |= {
                    f"frozen_{k}": figures[k] for k in ("auc", "logloss") if k in figures
                }
        result.by_pass = {n: m.compute() for n, m in scores.by_pass.items() if m.count}
        result.by_window = scores.windows.compute()
        result.window_left_out = scores.windows.left_out()
        if loop.audit is not None:
            loop.audit.flush(self.step)
        self.finished = not loop.done  # loop.done: stopped at max_steps
        if self.checkpoints and loop.cursor is not None:
            # Finished, the reader stands at the start of the epoch after the last: a run that
            # resumes it has that much more to read, not the end of the last epoch again.
            cursor = self.reader.state_dict() if self.finished else loop.cursor
            self.launcher.check()
            self.checkpoints.save(self.step, self.state(), cursor)
        scored = scores.progressive.compute() if scores.progressive.count else loop.scored
        result.metrics = result.metrics or {f"progressive_{k}": v for k, v in scored.items()}


@dataclass
class _Window:
    """The steps since the last log line."""

    rows: float = 0.0
    stall: StallMeter = field(default_factory=StallMeter)
    started: float = field(default_factory=time.perf_counter)


@dataclass
class _Loop:
    """What the training loop carries from step to step."""

    scores: ProgressiveScores = field(default_factory=ProgressiveScores)
    scored: dict[str, float] = field(default_factory=dict)
    """The last progressive validation reported."""
    window: _Window = field(default_factory=_Window)
    stall: StallMeter = field(default_factory=StallMeter)
    cursor: dict[str, Any] | None = None
    """The reader's cursor after the last batch trained on."""
    audit: AuditWriter | None = None
    """The row ids read since the last checkpoint (with ``audit_dir``; flow.handoff.audit)."""
    done: bool = False
    judged: int | None = None
    """The step of the last evaluation early stopping judged."""


@dataclass(frozen=True)
class Exported:
    """A model logged to MLflow: its URI, its registry version (None: not registered) and
    what it takes, ``raw`` event columns or ``features``."""

    uri: str
    version: str | None
    inputs: str


def export_model(session: Session, run: Run, *, final: bool) -> Exported:
    """Log the model to MLflow (pyfunc, with a signature) and register it when asked. It takes
    raw event columns where the channels recorded their features (trainers.serving), else the
    feature columns, and the final export says why."""
    from trainers.serving import log_model

    config = session.config
    features, why = features_of(config.location, config.channels)
    if final and features is None:
        session.say(f"the model takes feature columns, not raw events: {why}")
    uri, version = log_model(
        session.model,
        session.layout,
        run.run_id,
        tracking_uri=session.tracking_uri,
        register_as=config.register_as if final else None,
        features=features,
    )
    return Exported(uri, version, "features" if features is None else "raw")
