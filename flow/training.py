"""What a training run reads, builds and records: one typed configuration, torch-free.

:class:`TrainConfig` (with its :class:`ModelConfig` and :class:`OptimConfig`) is the only
description of a trainer run. The trainer's command line is generated from it
(:func:`parse_args`, with `tyro <https://brentyi.github.io/tyro/>`_), a run can be written to and
read from a JSON file (``--config run.json``), and the workflows that start a trainer
(``flow run --train``, ``flow retrain``, ``flow demo``) build the object and hand the trainer its
file, never a command line they assembled. It lives in ``flow`` so the core can build it without
importing torch; ``trainers`` runs it.

Why tyro: the dataclasses stay plain (``__post_init__`` checks name the field to change, as
everywhere else in the project), each option's help is the field's docstring, nested configs
become ``--model.*`` and ``--optim.*`` groups, and the few flags people type most keep short
aliases (``--channel``, ``--model``, ``--lr``). Pydantic would have meant models instead of
dataclasses for one parser; its validation is used only to read JSON files.

(Just past 400 lines: the three configs and the two ways in, file and command line, are one
idea; each field's docstring is its help text.)
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import tyro

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.storage import namespace_locations
from flow.train_defaults import derived_batch_size, size_line, training_rows

__all__ = [
    "DEFAULT_EARLY_STOP",
    "DEFAULT_EVAL_EPOCHS",
    "MODEL_NAMES",
    "DelayedFeedback",
    "EarlyStopOn",
    "EmbeddingConfig",
    "ModelConfig",
    "ModelName",
    "OptimConfig",
    "TrainConfig",
    "load_config",
    "location_settings",
    "parse_args",
    "save_config",
    "with_batch_size",
]

ModelName = Literal["deepfm", "dlrm", "wide_deep", "logistic", "popularity"]
"""The CTR models the trainer builds (the only place they are named): three deep architectures
and two baselines measured by the same loop on the same rows (``trainers.baselines``)."""
MODEL_NAMES: tuple[str, ...] = get_args(ModelName)
OptimizerKind = Literal["adam", "adagrad", "sgd"]
EarlyStopOn = Literal["auc", "logloss"]
ShuffleOn = Literal["auto", "host", "device"]
DelayedFeedback = Literal["auto", "fnw", "off"]
"""How the trainer corrects labels that arrive late (see ``TrainConfig.delayed_feedback``)."""
ROW_BLOCKS = ("label", "weight", "dense", "sparse", "ids")
"""Training-row columns a model or its loss reads (with ``seq_*``): never a metrics-only column."""


def _alias(*names: str) -> Any:
    """Short flags kept from before the CLI was generated (``--lr`` for ``--optim.lr``)."""
    return tyro.conf.arg(aliases=names)


def _check_sizes(name: str, sizes: Sequence[int]) -> None:
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise ConfigError(f"ModelConfig.{name} is {sizes!r}; give positive layer widths")


def _positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"OptimConfig.{name} is {value}; give a finite number > 0")


EmbeddingKind = Literal["hashed", "dynamic"]
Eviction = Literal["lru", "lfu"]
TtlUnit = Literal["steps", "seconds"]


@dataclass(frozen=True)
class EmbeddingConfig:
    """The table of one ``Id`` feature (raw 64-bit ids): ``hashed`` into ``rows`` rows, or
    ``dynamic``, a row per admitted id (``trainers.dynamic``). Row 0 of either is shared: null
    ids and, dynamic, the ids not admitted (yet) or not given a row."""

    feature: str
    """The ``Id`` feature's name in the layout (e.g. ``item_id``)."""
    kind: EmbeddingKind = "dynamic"
    """``dynamic`` (collisionless, admitted, expiring) or ``hashed`` (a fixed table)."""
    rows: int = 1 << 16
    """Rows of the table, row 0 included: its memory is ``rows x embedding_dim`` either way."""
    min_count: int = 1
    """Dynamic: an id gets a row once seen this many times (counted in a sketch of
    ``candidates`` cells, so a collision can admit an id early, never late)."""
    ttl: int | None = None
    """Dynamic: an id not seen for this long (``ttl_unit``) loses its row; None: never expires
    (rows are then freed only by eviction when the table is full)."""
    ttl_unit: TtlUnit = "steps"
    """Dynamic: ``steps`` (training steps) or ``seconds`` of event time (the batch's
    ``time_column``, microseconds)."""
    time_column: str = "ts"
    """Dynamic, ``ttl_unit='seconds'``: the batch column of event times (int64 microseconds)."""
    eviction: Eviction = "lru"
    """Dynamic, a full table: whom a newly admitted id replaces, ``lru`` (least recently seen,
    then least often) or ``lfu`` (least often seen, then least recently)."""
    candidates: int | None = None
    """Dynamic: cells of the admission sketch per hash (default ``2 x rows``); ignored when
    ``min_count`` is 1."""

    def __post_init__(self) -> None:
        where = f"EmbeddingConfig({self.feature!r})"
        if self.kind not in get_args(EmbeddingKind):
            raise ConfigError(f"{where}: kind={self.kind!r}; choose 'hashed' or 'dynamic'")
        if isinstance(self.rows, bool) or not 2 <= self.rows <= 2**31 - 1:
            raise ConfigError(f"{where}: rows={self.rows}; give 2..2^31-1 (row 0 is shared)")
        if isinstance(self.min_count, bool) or self.min_count < 1:
            raise ConfigError(f"{where}: min_count={self.min_count}; give 1 or more")
        if self.ttl is not None and (isinstance(self.ttl, bool) or self.ttl < 1):
            raise ConfigError(f"{where}: ttl={self.ttl}; give 1 or more, or None (no expiry)")
        if self.ttl_unit not in get_args(TtlUnit):
            raise ConfigError(f"{where}: ttl_unit={self.ttl_unit!r}; choose 'steps' or 'seconds'")
        if self.eviction not in get_args(Eviction):
            raise ConfigError(f"{where}: eviction={self.eviction!r}; choose 'lru' or 'lfu'")
        if self.candidates is not None and self.candidates < 1:
            raise ConfigError(f"{where}: candidates={self.candidates}; give 1 or more, or None")
        if self.kind == "hashed":
            changed = [
                name
                for name, default in (
                    ("min_count", 1),
                    ("ttl", None),
                    ("ttl_unit", "steps"),
                    ("eviction", "lru"),
                    ("candidates", None),
                )
                if getattr(self, name) != default
            ]
            if changed:
                raise ConfigError(
                    f"{where}: {', '.join(changed)} apply to kind='dynamic' only; remove them "
                    "or set kind='dynamic'"
                )

    @property
    def sketch_width(self) -> int:
        return self.candidates or 2 * self.rows


@dataclass(frozen=True)
class ModelConfig:
    """Which CTR model to build and how big."""

    name: Annotated[ModelName, _alias("--model")] = "dlrm"
    """The model: ``deepfm``, ``dlrm`` or ``wide_deep``; or a baseline: ``logistic`` (hashed
    logistic regression: a weight per id and per dense value) or ``popularity`` (the smoothed
    click rate of ``field``'s value)."""
    embedding_dim: Annotated[int, _alias("--embedding-dim")] = 16
    """Width of every feature embedding (DLRM's dot-product interaction needs one width)."""
    hidden: Annotated[tuple[int, ...], _alias("--hidden")] = (256, 128)
    """Hidden widths of the top MLP (DLRM) or the deep part (DeepFM, Wide & Deep)."""
    bottom: tuple[int, ...] = (64,)
    """DLRM's bottom MLP over the dense block; a last layer to ``embedding_dim`` is added."""
    max_embedding_rows: Annotated[int, _alias("--max-embedding-rows")] = 2**22
    """Rows per table at most. A feature with a larger cardinality is hashed down: id ``i`` uses
    row ``i % max_embedding_rows`` (hashed buckets can be far larger than memory allows)."""
    dropout: float = 0.0
    """Dropout after each hidden layer of the MLPs."""
    field: str | None = None
    """``popularity`` only: the sparse feature (a layout name, e.g. ``item_id``) whose values'
    click rates are the prediction."""
    smoothing: float = 20.0
    """``popularity`` only: impressions of the overall click rate added to every value's own,
    so a value seen a few times predicts close to the average (additive smoothing)."""
    embeddings: tuple[EmbeddingConfig, ...] = ()
    """The tables of the layout's ``Id`` features (raw ids), one entry each; an ``Id`` feature
    without one is hashed into ``max_embedding_rows`` rows. Set in a ``--config`` file:
    ``"embeddings": [{"feature": "item_id", "kind": "dynamic", "rows": 65536}]``."""

    def __post_init__(self) -> None:
        if self.name not in MODEL_NAMES:
            raise ConfigError(
                f"ModelConfig.name is {self.name!r}; choose one of {', '.join(MODEL_NAMES)}"
            )
        if isinstance(self.embedding_dim, bool) or self.embedding_dim < 1:
            raise ConfigError(f"ModelConfig.embedding_dim is {self.embedding_dim}; give 1 or more")
        # Lists from YAML/JSON become tuples so the config stays hashable and immutable.
        object.__setattr__(self, "hidden", tuple(self.hidden))
        object.__setattr__(self, "bottom", tuple(self.bottom))
        _check_sizes("hidden", self.hidden)
        _check_sizes("bottom", self.bottom)
        if isinstance(self.max_embedding_rows, bool) or self.max_embedding_rows < 1:
            raise ConfigError(
                f"ModelConfig.max_embedding_rows is {self.max_embedding_rows}; give 1 or more"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"ModelConfig.dropout is {self.dropout}; give a value in [0, 1)")
        if self.name == "popularity" and not self.field:
            raise ConfigError(
                "ModelConfig.field is not set: the popularity baseline needs the sparse feature "
                "whose click rates it predicts (--model.field item_id)"
            )
        if self.name != "popularity" and self.field is not None:
            raise ConfigError(
                f"ModelConfig.field is {self.field!r} but only the popularity model reads it; "
                f"leave it unset for {self.name}"
            )
        if not (math.isfinite(self.smoothing) and self.smoothing > 0):
            raise ConfigError(f"ModelConfig.smoothing is {self.smoothing}; give a number > 0")
        # Dicts from JSON (and a saved model's asdict) become the typed entries.
        embeddings = tuple(
            e if isinstance(e, EmbeddingConfig) else EmbeddingConfig(**e) for e in self.embeddings
        )
        object.__setattr__(self, "embeddings", embeddings)
        features = [e.feature for e in embeddings]
        twice = sorted({f for f in features if features.count(f) > 1})
        if twice:
            raise ConfigError(
                f"ModelConfig.embeddings: feature(s) {', '.join(twice)} have two entries; keep one"
            )
        if embeddings and self.name == "popularity":
            raise ConfigError(
                "ModelConfig.embeddings: the popularity baseline has no Id tables; use another "
                "model, or remove the embeddings"
            )


SEVERAL_PASSES_EMBEDDING_L2 = 1e-4
"""The embedding tables' L2 penalty by default when a run reads its rows several times: the id
tables overfit in a few epochs without it, and with it the deep models beat a logistic
regression where one pass did not; one pass over the rows gains nothing from it (measured in
docs/trainers.md, "Models against baselines")."""


DEFAULT_EARLY_STOP = 2
"""Evaluations without improvement a run with an eval channel waits for by default: one bad
epoch can be noise, two in a row rarely are (issue 48, "defaults that learn")."""

DEFAULT_EVAL_EPOCHS = 10
"""Epochs at most when ``--epochs`` is not given and early stopping is on (an eval channel):
the held-out rows choose when to stop. One pass left the deep models 0.02 AUC short of the epochs
the holdout chooses on data with interactions (docs/trainers.md, "Models against baselines");
they stop after 2-4 epochs there, so ten is a bound, not a cost."""


@dataclass(frozen=True)
class OptimConfig:
    """How to optimize a CTR model: its embedding tables and its dense layers."""

    embedding: Annotated[OptimizerKind, _alias("--embedding-optimizer")] = "adagrad"
    """Optimizer of the embedding tables: ``adam``, ``adagrad`` or ``sgd``. Adagrad by default:
    a row's step shrinks with its own gradients only, so a rare id still moves when it comes,
    while Adam at the dense layers' rate moves every row by about the same small amount per
    step (measured in docs/trainers.md, "Models against baselines")."""
    dense: Annotated[OptimizerKind, _alias("--optimizer")] = "adam"
    """Optimizer of every other parameter (MLPs, dense projections, biases)."""
    lr: Annotated[float, _alias("--lr")] = 1e-3
    """Learning rate of the dense parameters, and of the tables unless ``embedding_lr`` is set."""
    embedding_lr: Annotated[float | None, _alias("--embedding-lr")] = 0.05
    """Learning rate of the embedding tables; None uses ``lr``. The default suits Adagrad (with
    ``--embedding-optimizer adam``, give about 1e-3 or None)."""
    weight_decay: float = 0.0
    """L2 penalty added to the gradients of both groups (torch's ``weight_decay``)."""
    embedding_weight_decay: float | None = None
    """The embedding tables' own L2 penalty; None uses ``weight_decay`` when that is set, and
    otherwise 1e-4 for a run of several epochs, 0 for one pass (TrainConfig.effective_optim)."""
    cowclip: Annotated[bool, _alias("--cowclip")] = False
    """Clip embedding gradients with CowClip (``trainers.optim.CowClip``), for large batches."""
    cowclip_ratio: float = 1.0
    """CowClip's r: a row's gradient may be up to r times its weight's norm per occurrence."""
    cowclip_min: float = 1e-5
    """CowClip's ζ: the lower bound of the threshold, so rows near zero can still move."""

    def __post_init__(self) -> None:
        allowed = get_args(OptimizerKind)
        for name in ("embedding", "dense"):
            if getattr(self, name) not in allowed:
                raise ConfigError(
                    f"OptimConfig.{name} is {getattr(self, name)!r}; "
                    f"choose one of {', '.join(allowed)}"
                )
        _positive("lr", self.lr)
        if self.embedding_lr is not None:
            _positive("embedding_lr", self.embedding_lr)
        for name in ("weight_decay", "embedding_weight_decay"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"OptimConfig.{name} is {value}; give 0 or more")
        _positive("cowclip_ratio", self.cowclip_ratio)
        _positive("cowclip_min", self.cowclip_min)

    def scaled_for(self, factor: float) -> OptimConfig:
        """This configuration for a batch ``factor`` times larger, by CowClip's scaling rule.

        The embedding learning rate stays, the dense one grows by ``sqrt(factor)``, the
        embedding L2 penalty by ``factor`` (fewer steps apply it); CowClip is turned on. The
        rule also warms the dense learning rate up, which is the training loop's to do.
        """
        _positive("factor", factor)
        decay = (
            self.weight_decay
            if self.embedding_weight_decay is None
            else self.embedding_weight_decay
        )
        return replace(
            self,
            lr=self.lr * math.sqrt(factor),
            embedding_lr=self.embedding_lr or self.lr,
            embedding_weight_decay=decay * factor,
            cowclip=True,
        )


@dataclass(frozen=True)
class TrainConfig:
    """A training run: which channels, which model, how to read, what to record."""

    channels: Annotated[tuple[str, ...], _alias("--channel"), tyro.conf.UseAppendAction] = ()
    """Channels to train on (repeat the flag: ``--channel backfill --channel live``)."""
    namespace: str = "default"
    """The pipeline namespace; the handoff and checkpoints default to its folders."""
    handoff: str | None = None
    """The handoff location (path or URI) holding the channels; None: the namespace's."""
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    mix: dict[str, float] | None = None
    """Weights per channel (``--mix backfill 1 live 3``); None with several channels reads them
    in order (priority)."""
    eval_channel: str | None = None
    """Held-out rows for AUC and log loss; without one, progressive validation only (each batch
    is scored before the model trains on it)."""
    batch_size: int | None = None
    """Rows a step. None: derived from the training rows (``flow.train_defaults``): the largest
    power of two giving at least 300 steps an epoch, 32 to 4,096; 4,096 when the rows are not
    known ahead (``--follow``). The trainer prints how it chose."""
    window_batches: int = 16
    """Batches shuffled together (the reader's window)."""
    seed: int = 0
    epochs: int | None = None
    """Passes over the channels. None: up to :data:`DEFAULT_EVAL_EPOCHS` when early stopping is
    on (an eval channel is given: the held-out rows choose), else 1 (see :attr:`effective_epochs`).
    A followed channel is read once."""
    max_steps: int | None = None
    follow: bool = False
    """Continuous mode: follow the channels' new commits until they are closed."""
    full_batches: bool = False
    """Following: every batch ``batch_size`` rows, a commit's rows short of one waiting for the
    next commit. By default each commit is trained on whole as it lands (its last batch
    smaller), which takes a trigger interval off the freshness of those rows."""
    device: str = "auto"
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N``."""
    bf16: bool | None = None
    """Mixed precision (bf16 autocast); default on for CUDA, off on CPU."""
    compile: bool = False
    """``torch.compile`` the model."""
    cuda_graph: bool = False
    """Capture each training step as one CUDA graph and replay it (``trainers.graphed``): for
    small batches, where launching the step's kernels from Python is the bottleneck. Needs
    CUDA, one rank, Adam for the tables and the dense layers, no CowClip and no --compile."""
    shuffle_on: ShuffleOn = "auto"
    """Where the window shuffle's gather runs: ``host`` (the reader), ``device`` (the GPU, from
    windows copied in order; the same batches), ``auto``: the device on CUDA, else the host."""
    reader_threads: int = 2
    """Threads per rank that read, check and decompress shards ahead of use."""
    log_every: int = 50
    eval_every: int | None = None
    """Evaluate (eval channel or held-out buckets) every this many steps."""
    eval_batches: int | None = None
    early_stop: int | None = None
    """Stop when ``early_stop_on`` has not improved for this many evaluations in a row, and
    report and export the best model seen (its weights are kept in ``best/`` of the checkpoint
    folder). Evaluations come every ``eval_every`` steps, or at the end of each epoch without
    it: ``--epochs 20 --early-stop 2`` lets the eval channel choose the number of epochs.
    Needs ``eval_channel`` or ``holdout_share``. None: 2 when ``eval_channel`` is given (and
    the run can evaluate: not ``--follow`` without ``--eval-every``), else off; 0: off."""
    early_stop_on: EarlyStopOn = "auc"
    """The evaluation figure early stopping follows: ``auc`` (higher is better) or
    ``logloss`` (lower is better)."""
    checkpoint_dir: str | None = None
    """A path or a URI (``s3://...``); None: a folder of the run's own in the namespace's
    checkpoints (FLOW_CHECKPOINTS),
    ``trainer/<channels>/<model>-<settings>`` (other settings: another folder). A folder given
    here that holds a run with other settings is refused (see ``fresh``)."""
    fresh: bool = False
    """Discard the checkpoints in the checkpoint folder and train from scratch."""
    checkpoint_every: int = 500
    export_every: int | None = None
    """Continuous mode: log (and register) the model every this many steps."""
    consumer_group: str = "trainer"
    tracking: bool = True
    """Track the run in MLflow (``--no-tracking``: not at all)."""
    experiment: str = "trainer"
    parent_run_id: str | None = None
    """Nest the trainer's MLflow runs under this run."""
    register_as: str | None = None
    """Register the model under this name."""
    event_time: str | None = None
    """A timestamp column of the rows, for freshness (event -> training step) and the
    progressive metrics per event-time window."""
    produced_time: str | None = "produced_at"
    """A timestamp column saying when a row was produced (the Kafka record's timestamp), for
    freshness produced -> training step; rows where it is null (backfill) are left out, and a
    channel without the column has no such figure. None: not read."""
    delayed_feedback: DelayedFeedback = "auto"
    """The correction for channels labelled ``immediate`` (every impression at once as a
    negative, again as a positive when its click comes): ``auto``: the fake-negative weighted
    loss (FNW, Ktena et al. 2019) on exactly those channels, plain cross-entropy on the rest;
    ``fnw``: FNW on every channel; ``off``: plain cross-entropy everywhere (on an immediate
    channel it learns p/(1+p), not the click rate p)."""
    oracle: str | None = None
    """A column holding each row's true click probability (synthetic data only, e.g.
    ``p_click``): progressive and evaluation metrics add ``oracle_auc`` and ``oracle_logloss``
    over the same rows and labels as the model's. Read for metrics only, never a model input;
    rows where it is null are left out of the oracle figures and counted (``oracle_missing``)."""
    frozen_after: str | None = None
    """A channel (e.g. ``backfill``): when the trainer moves on from it to another, a copy of
    the model is frozen, and every later batch is also scored by that copy (progressive
    ``frozen_auc``, ``frozen_logloss`` per channel): what training on goes on to be worth
    against a model that stopped after that channel. Costs one more forward pass per batch and
    a second copy of the model."""
    metrics_window_s: float = 3600.0
    """Progressive metrics also per event-time window of this many seconds, per channel, over
    rows seen for the first time (needs ``event_time``); 0: none."""
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
    """Each rank writes the id of every row it trained on here, a part at each checkpoint and at
    the end (flow.handoff.audit); ``flow handoff verify --audit`` proves them exactly once."""
    result_file: Path | None = None
    """Rank 0 writes the run's summary here as JSON."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "channels", tuple(self.channels))
        if not self.channels:
            raise ConfigError("name at least one channel to train on (--channel live)")
        if self.mix is not None and set(self.mix) != set(self.channels):
            raise ConfigError(
                f"--mix names {sorted(self.mix)} but the channels are {sorted(self.channels)}"
            )
        if (self.batch_size is not None and self.batch_size < 2) or self.window_batches < 2:
            raise ConfigError("batch size and window (in batches) must be at least 2")
        if self.epochs is not None and (isinstance(self.epochs, bool) or self.epochs < 1):
            raise ConfigError(f"--epochs {self.epochs}: give 1 or more passes over the channels")
        if not 0 <= self.holdout_share < 1:
            raise ConfigError(f"--holdout-share {self.holdout_share}: give a share in [0, 1)")
        if (self.init_from_champion or self.promote_margin is not None) and not self.register_as:
            raise ConfigError("--init-from-champion and --promote-margin need --register-as NAME")
        if self.shuffle_on not in get_args(ShuffleOn):
            raise ConfigError(f"--shuffle-on {self.shuffle_on!r}: use auto, host or device")
        if self.reader_threads < 1:
            raise ConfigError(f"--reader-threads {self.reader_threads}: give 1 or more")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"--device {self.device!r}: use auto, cpu, cuda or cuda:N")
        self._check_early_stop()
        self._check_metrics_settings()
        self._check_cuda_graph()

    def _check_cuda_graph(self) -> None:
        if not self.cuda_graph:
            return
        if self.device == "cpu":
            raise ConfigError("--cuda-graph needs a CUDA device; leave it off with --device cpu")
        if self.compile:
            raise ConfigError(
                "--cuda-graph and --compile: choose one (torch.compile graphs a model itself "
                "with mode='reduce-overhead')"
            )
        if self.optim.cowclip:
            raise ConfigError(
                "--cuda-graph cannot capture CowClip's per-row clipping; leave --cowclip off"
            )
        if {self.optim.embedding, self.optim.dense} != {"adam"}:
            raise ConfigError(
                f"--cuda-graph needs Adam for both groups, not embedding={self.optim.embedding!r} "
                f"and dense={self.optim.dense!r}: give --embedding-optimizer adam --optimizer adam"
            )

    def _check_early_stop(self) -> None:
        if self.early_stop_on not in get_args(EarlyStopOn):
            raise ConfigError(f"--early-stop-on {self.early_stop_on!r}: use auc or logloss")
        if self.early_stop is None or self.early_stop == 0:
            return
        if isinstance(self.early_stop, bool) or self.early_stop < 0:
            raise ConfigError(
                f"--early-stop {self.early_stop}: give the evaluations without improvement to "
                "wait for (1 or more), or 0 for none"
            )
        if not self.eval_channel and not self.holdout_share:
            raise ConfigError(
                "--early-stop needs held-out rows to judge on: give --eval-channel NAME or "
                "--holdout-share 0.1"
            )
        if self.eval_every is None and self.follow:
            raise ConfigError(
                "--early-stop with --follow needs --eval-every STEPS: a followed channel has "
                "no epochs to evaluate at the end of"
            )

    def _check_metrics_settings(self) -> None:
        if self.delayed_feedback not in get_args(DelayedFeedback):
            raise ConfigError(f"--delayed-feedback {self.delayed_feedback!r}: use auto, fnw or off")
        if not (math.isfinite(self.metrics_window_s) and self.metrics_window_s >= 0):
            raise ConfigError(
                f"--metrics-window-s {self.metrics_window_s}: give seconds >= 0 (0: no windows)"
            )
        for flag, column in (
            ("--oracle", self.oracle),
            ("--produced-time", self.produced_time),
            ("--event-time", self.event_time),
        ):
            if column is not None and (
                column in ROW_BLOCKS or column.startswith("seq_") or not column
            ):
                raise ConfigError(
                    f"{flag} {column!r} names a column the model or its loss reads; name a "
                    "column of its own"
                )

    @property
    def location(self) -> str:
        """The handoff location (set by :meth:`resolved` when not given)."""
        if self.handoff is None:
            raise ConfigError(
                "TrainConfig.handoff is not set: give handoff= or call config.resolved(stack)"
            )
        return self.handoff

    @property
    def batch(self) -> int:
        """The batch size, once given or derived (:func:`with_batch_size`)."""
        if self.batch_size is None:
            raise ConfigError(
                "TrainConfig.batch_size is not derived yet: give --batch-size, or call "
                "flow.training.with_batch_size(config) first"
            )
        return self.batch_size

    @property
    def effective_early_stop(self) -> int | None:
        """``early_stop`` with its default resolved: on (patience
        :data:`DEFAULT_EARLY_STOP`) when an eval channel is given, so the model a run keeps is
        the one its evaluation rows liked best; None when off."""
        if self.early_stop is not None:
            return self.early_stop or None
        if self.eval_channel and (self.eval_every or not self.follow):
            return DEFAULT_EARLY_STOP
        return None

    @property
    def effective_epochs(self) -> int:
        """``epochs`` with its default resolved: the epochs the run trains at most."""
        if self.follow:
            return 1
        if self.epochs is not None:
            return self.epochs
        return DEFAULT_EVAL_EPOCHS if self.effective_early_stop else 1

    @property
    def effective_optim(self) -> OptimConfig:
        """``optim`` with the embedding L2 default resolved (an explicit penalty wins): see
        :data:`SEVERAL_PASSES_EMBEDDING_L2`. Following reads each row once."""
        optim = self.optim
        if optim.embedding_weight_decay is not None or optim.weight_decay:
            return optim
        several = self.effective_epochs > 1
        return replace(
            optim, embedding_weight_decay=SEVERAL_PASSES_EMBEDDING_L2 if several else 0.0
        )

    def identity(self) -> dict[str, Any]:
        """The settings that make this run's result: what it reads, the model, how it learns.

        A checkpoint records them (after defaults are applied: :attr:`effective_optim`), and
        only a run with the same ones resumes it; the default checkpoint folder is named by
        them, so other settings train in a folder of their own. Left out: how
        long it trains (``epochs``, ``max_steps``: raising them goes on from a checkpoint), where
        and how fast it runs, and what it reports."""
        # The effective settings, defaults applied: a default that another setting changes
        # (the embedding L2 of several epochs) changes the run, so it changes the identity.
        data = config_to_dict(replace(self, optim=self.effective_optim))
        # Only when set: checkpoints recorded before dynamic tables existed still belong.
        if not data["model"].get("embeddings"):
            data["model"].pop("embeddings", None)
        return {k: v for k, v in sorted(data.items()) if k not in _NOT_IDENTITY}

    def resolved(self, stack: StackConfig) -> TrainConfig:
        """The same run with the handoff and checkpoint folder the namespace defaults to."""
        where = namespace_locations(stack, self.namespace)
        run = replace(self, handoff=self.handoff or where.handoff.uri)
        if run.checkpoint_dir is not None:
            return run
        # Named by the settings the trainer will use: a derived batch size is one of them.
        try:
            sized, _ = with_batch_size(run)
        except OSError:  # an unreachable handoff: the trainer says so, naming the setting
            sized = run
        own = f"{run.model.name}-{fingerprint(sized.identity())}"
        folder = where.checkpoints.child("trainer", "-".join(self.channels), own)
        return replace(run, checkpoint_dir=folder.uri)


def with_batch_size(config: TrainConfig) -> tuple[TrainConfig, str | None]:
    """``config`` with its batch size set, and the line saying how it was derived (None when
    it was given: a given size always wins). See :mod:`flow.train_defaults`."""
    if config.batch_size is not None:
        return config, None
    rows = (
        None
        if config.follow
        else training_rows(
            config.location, config.channels, config.after_commit, config.holdout_share
        )
    )
    size = derived_batch_size(rows)
    return replace(config, batch_size=size), size_line(size, rows)


def location_settings(config: TrainConfig, stack: StackConfig) -> tuple[str, str]:
    """The settings that chose ``config``'s handoff and checkpoint folder, as a probe's error
    names them: ``FLOW_HANDOFF`` and the checkpoints root's setting for the namespace's own
    folders (:meth:`TrainConfig.resolved`), else the options that named others. An error must
    not blame ``--checkpoint-dir`` when the user never gave one."""
    handoff = "--handoff (under flow run --train: the pipeline's HandoffOutput.location)"
    if config.handoff in (None, replace(config, handoff=None).resolved(stack).handoff):
        handoff = "FLOW_HANDOFF"
    checkpoints = "--checkpoint-dir"
    default = replace(config, checkpoint_dir=None).resolved(stack).checkpoint_dir
    if config.checkpoint_dir in (None, default):
        checkpoints = stack.checkpoints_from
    return handoff, checkpoints


_NOT_IDENTITY = frozenset(
    {
        "namespace",  # the handoff it resolves to is kept
        "epochs",
        "max_steps",
        "early_stop",  # patience, like epochs: more of it goes on from a checkpoint
        "device",
        "bf16",
        "compile",
        "cuda_graph",  # the same steps, launched at once
        "shuffle_on",  # the same batches either way
        "reader_threads",
        "log_every",
        "eval_every",
        "eval_batches",
        "eval_channel",
        "checkpoint_dir",
        "checkpoint_every",
        "export_every",
        "consumer_group",
        "tracking",
        "experiment",
        "parent_run_id",
        "register_as",
        "promote_margin",
        "event_time",
        "produced_time",
        "oracle",
        "frozen_after",
        "metrics_window_s",
        "wait_for_channels",
        "audit_dir",
        "result_file",
        "fresh",
    }
)
"""TrainConfig fields that do not change what a run learns (a new field counts until listed)."""


def fingerprint(settings: Mapping[str, Any]) -> str:
    """Ten hex digits of the settings' JSON: the same settings, the same digits."""
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


# -- files and command lines -----------------------------------------------------------------


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass a field's type names (itself, or inside Optional/Annotated), if any."""
    if typing.get_origin(hint) is Annotated:
        hint = get_args(hint)[0]
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        found = [_dataclass_in(a) for a in get_args(hint)]
        return next((f for f in found if f is not None), None)
    return None


def _items_dataclass(hint: Any) -> type | None:
    """The dataclass of a ``tuple[Dataclass, ...]`` field's entries, if it is one."""
    if typing.get_origin(hint) is Annotated:
        hint = get_args(hint)[0]
    if typing.get_origin(hint) is tuple:
        args = get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return _dataclass_in(args[0])
    return None


def _check_keys(kind: type, data: Mapping[str, Any], where: str) -> None:
    """Unknown keys are an error naming the closest known one, never silently ignored."""
    hints = typing.get_type_hints(kind, include_extras=True)
    known = [f.name for f in dataclasses.fields(kind)]
    for key, value in data.items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(known)}"
            raise ConfigError(f"{where}: unknown setting {key!r}{hint}")
        nested = _dataclass_in(hints[key])
        if nested is not None and isinstance(value, Mapping):
            _check_keys(nested, value, f"{where}.{key}")
        items = _items_dataclass(hints[key])  # a tuple of entries (ModelConfig.embeddings)
        if items is not None and isinstance(value, list):
            for k, item in enumerate(value):
                if isinstance(item, Mapping):
                    _check_keys(items, item, f"{where}.{key}.{k}")


def config_from_dict(data: Mapping[str, Any], where: str = "TrainConfig") -> TrainConfig:
    """A TrainConfig from plain data (a JSON file's): unknown keys and bad values name the
    setting to change."""
    from pydantic import TypeAdapter, ValidationError

    _check_keys(TrainConfig, data, where)
    try:
        return TypeAdapter(TrainConfig).validate_python(dict(data))
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{where}: {path}: {first['msg']} (got {first.get('input')!r})") from exc


def config_to_dict(config: TrainConfig) -> dict[str, Any]:
    """``config`` as JSON-ready data (what :func:`config_from_dict` reads back)."""
    from pydantic import TypeAdapter

    data: dict[str, Any] = TypeAdapter(TrainConfig).dump_python(config, mode="json")
    return data


def save_config(config: TrainConfig, path: Path) -> Path:
    """Write ``config`` as JSON to ``path`` (a trainer reads it with ``--config PATH``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config_to_dict(config), indent=2, sort_keys=True) + "\n")
    return path


def load_config(path: Path) -> TrainConfig:
    """The TrainConfig in a JSON file written by :func:`save_config` or by hand."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--config {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path} must hold a JSON object of settings")
    return config_from_dict(data, where=str(path))


def _split_config(argv: Sequence[str]) -> tuple[Path | None, list[str]]:
    """``--config FILE`` (or ``--config=FILE``) and the other arguments."""
    rest: list[str] = []
    found: Path | None = None
    items = iter(argv)
    for arg in items:
        if arg == "--config":
            value = next(items, None)
            if value is None:
                raise ConfigError("--config needs a file: --config run.json")
            found = Path(value)
        elif arg.startswith("--config="):
            found = Path(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    return found, rest


_Flags = Annotated["TrainConfig", tyro.conf.arg(name="")]
"""A TrainConfig's fields as top-level flags (``--batch-size``, ``--model.name``)."""


def _entry(base: TrainConfig | None) -> Callable[..., TrainConfig]:
    """What tyro calls. A function, not the class itself: tyro turns a ValueError raised while
    building a class it was given into a usage message and an exit, and a ConfigError must
    reach the caller (the ``flow`` command prints it as one line, a workflow fails early)."""
    if base is None:

        def build(config: _Flags) -> TrainConfig:
            return config

        return build

    def build_on(config: _Flags = base) -> TrainConfig:
        return config

    return build_on


def parse_args(
    argv: Sequence[str],
    *,
    base: TrainConfig | None = None,
    prog: str = "python -m trainers train",
) -> TrainConfig:
    """A TrainConfig from a command line: ``--config FILE`` first (or ``base``), then flags.

    Flags override the file; ``--help`` lists every setting with its docstring. Unknown flags
    and values of the wrong type exit with a usage message; a setting a config refuses
    (``__post_init__``) raises ConfigError naming the flag.
    """
    path, rest = _split_config(argv)
    default = load_config(path) if path is not None else base
    return tyro.cli(_entry(default), args=rest, prog=prog, description=_DESCRIPTION)


_DESCRIPTION = (
    "Train a CTR model on handoff channels (one process per rank). Settings come from "
    "--config FILE (JSON) and then the flags below."
)
