"""Settings a training run derives from its data when they are not given: the batch size (its
rule and the rows it reads; ``flow.training.with_batch_size`` applies it to a ``TrainConfig``).

A fixed 4,096-row batch is one step an epoch on 800 training rows, and such a run learns
nothing (issue 48: DLRM's evaluation AUC 0.468 with the default, 0.687 with 64 rows a batch).
The batch size is instead derived from the rows the run will read, which the channels' commit
logs hold without a row read, so the same channels give the same size every time and the size
is part of the run's identity (its checkpoint folder) like any setting.

The learning rates stay: the dense layers' Adam and the tables' Adagrad divide each step by the
gradients' own scale, so their step does not grow with the batch as plain SGD's does, and a
smaller batch gets more steps of the same size (measured in docs/trainers.md, "Derived
defaults"). CowClip's rule for larger batches (``OptimConfig.scaled_for``) is the opposite case.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "MIN_BATCH_SIZE",
    "STEPS_PER_EPOCH",
    "derived_batch_size",
    "size_line",
    "training_rows",
]

DEFAULT_BATCH_SIZE = 4096
"""The batch size of large data, and of a followed channel (its rows are not known ahead)."""
MIN_BATCH_SIZE = 32
"""The smallest derived batch: below it a step's gradient is mostly noise and the step's fixed
cost dominates."""
STEPS_PER_EPOCH = 300
"""Steps an epoch a derived batch aims at, at least (a few hundred: the models' optimizers
settle in about that many)."""


def derived_batch_size(rows: int | None) -> int:
    """The largest power of two with at least :data:`STEPS_PER_EPOCH` steps in ``rows``,
    within [:data:`MIN_BATCH_SIZE`, :data:`DEFAULT_BATCH_SIZE`]; the default when ``rows`` is
    not known (None)."""
    if rows is None:
        return DEFAULT_BATCH_SIZE
    target = rows // STEPS_PER_EPOCH
    if target < MIN_BATCH_SIZE:
        return MIN_BATCH_SIZE
    return min(DEFAULT_BATCH_SIZE, 1 << (target.bit_length() - 1))


def training_rows(
    location: str, channels: Sequence[str], after_commit: int, holdout_share: float
) -> int | None:
    """The rows one epoch trains on, from the commit logs (no row is read): the committed
    rows of ``channels`` after ``after_commit``, less the held-out share. None for a channel
    that does not exist yet."""
    from flow.handoff import Channel

    total = 0
    for name in channels:
        channel = Channel(location, name)
        if not channel.exists():
            return None
        ids = [i for i in channel.commit_ids() if i > after_commit]
        total += channel.log.rows(ids, None)
    return int(total * (1 - holdout_share))


def size_line(size: int, rows: int | None) -> str:
    """The line a run says of the batch size it derived from ``rows`` (None: not known)."""
    if rows is None:
        why = "the default for rows not known ahead (a followed or not yet created channel)"
    else:
        why = f"derived from {rows:,} training rows (~{max(rows // size, 1):,} steps an epoch)"
    return f"batch size {size:,}: {why}; give --batch-size to choose"
