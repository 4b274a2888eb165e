"""Dynamic embedding tables: raw 64-bit ids to rows of a bounded table, without collisions.

Monolith's tables (Liu et al., 2022): an id gets a row of its own once it has been seen
``min_count`` times (admission), loses it when not seen for ``ttl`` (expiry), and when the table
is full a newly admitted id takes the row of the least recently (``lru``) or least often
(``lfu``) seen id (eviction). Ids not admitted, and null ids, share row 0. Hashing instead mixes
a new item with whatever old items share its bucket; a fitted vocabulary sends it to OOV until
the next backfill.

Why our own and not torchrec's managed-collision modules: torchrec needs fbgemm-gpu, whose CUDA
wheels are larger than what can be carried to our GPU machines, and torchrec 1.9 with
fbgemm-gpu 1.9 does not load against torch 2.13 (an ABI mismatch in fbgemm's ``.so``); the 1.8
pair that loads is CPU-only and documented as beta. What follows is plain tensor code that runs
wherever torch does, CPU or CUDA, in a few hundred lines.

How the state is held (every piece a buffer, so it follows the model to its device and is in
its ``state_dict``: checkpoints resume it exactly, the exported model scores raw ids with it):

- ``keys[r]``: the id holding row ``r`` (``FREE`` if none; row 0 is always ``FREE``), with
  ``counts[r]`` (times seen) and ``last[r]`` (when last seen: a step or an event time).
- ``sorted_keys`` / ``sorted_rows``: ``keys`` sorted, for :meth:`DynamicTable.lookup` by
  ``torch.searchsorted``: O(log rows) per id, fixed shapes, no host synchronisation. Derived
  from ``keys``, so not saved: rebuilt when a state is loaded, and after each update (one sort
  of the table's keys per step: the fixed cost that makes small tables relatively slow).
- ``sketch`` / ``sketch_time``: a count-min sketch (``depth`` hashes x ``width`` cells) counting
  ids not admitted yet, bounded whatever the number of distinct ids. A collision can only
  overcount, so an id is admitted early, never late; a cell not touched for ``ttl`` restarts
  from zero, so the sketch forgets as the table does.

:meth:`DynamicTable.update` (a training forward) is a fixed-shape function of the ids it is
given: ties are broken by id and by row index, never by thread timing (the rows to give away
are the ``k`` smallest of a distinct key per row, class, policy and row index in one int64, so
``torch.topk`` picks the same ones on any device without a stable sort of every row). Under
DDP each rank gives it every rank's ids (:func:`gather_ids`), so every rank computes the same
mapping. It makes no host synchronisation either, so a CUDA step does not wait on it.

A row given to a new id is re-initialised (:func:`initial_rows`: a hash of the id, not the random
generator, so every rank and every resumed run writes the same values) and its optimizer state
is zeroed (:func:`reset_optimizer_rows`): for Adagrad that makes the row exactly a new
parameter; for Adam the moments restart from zero but the step count (one per tensor) does not,
so its bias correction is spent and a reused row's first step is about
``(1-beta1)/sqrt(1-beta2)`` (~3x) the learning rate, where a new parameter's is 1x. Adagrad is
the embeddings' default optimizer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn

from flow.errors import ConfigError, SchemaMismatchError
from flow.pipeline.features import NULL_ID
from flow.pipeline.schema import did_you_mean
from flow.pipeline.state import Layout
from flow.training import EmbeddingConfig, ModelConfig

__all__ = [
    "FREE",
    "DynamicTable",
    "IdTables",
    "Placement",
    "gather_ids",
    "hash_ids",
    "initial_rows",
    "reset_optimizer_rows",
]

FREE = 2**63 - 1
"""The key of a row no id holds; as an input id, like ``NULL_ID``, it maps to row 0."""

_PRIME = 2**31 - 1
# Multipliers below 2**30: a 32-bit half times one stays below 2**62, so no int64 overflows.
_MULTIPLIERS = (
    (1_000_003, 914_797_577),
    (740_287_063, 1_021_587_337),
    (826_580_573, 543_451_409),
    (967_215_997, 689_320_003),
)
_SKETCH_DEPTH = 2


def hash_ids(ids: Tensor, seed: int) -> Tensor:
    """A hash of int64 ids into ``[0, 2**31 - 1)``, the same on every device: two rounds of
    multiply-add modulo a Mersenne prime over the ids' 32-bit halves."""
    a, b = _MULTIPLIERS[seed % len(_MULTIPLIERS)]
    low = ids & 0xFFFFFFFF
    high = (ids >> 32) & 0xFFFFFFFF
    h = ((low * a) % _PRIME + (high * b) % _PRIME + seed * 7919 + 17) % _PRIME
    h = h ^ (h >> 13)
    return (h * b % _PRIME + a) % _PRIME


def initial_rows(ids: Tensor, dim: int, std: float, salt: int = 0) -> Tensor:
    """The initial vectors ``[len(ids), dim]`` of ids given a row: uniform with deviation
    ``std``, a function of the id alone, so that ranks and resumed runs agree without a shared
    random generator."""
    if std <= 0:
        return torch.zeros(ids.shape[0], dim, device=ids.device)
    columns = torch.arange(dim, device=ids.device) + 1000 * salt
    low = hash_ids(ids.unsqueeze(1) + columns * 0x9E3779B1, 1)
    uniform = hash_ids(low + columns, 2).float() / _PRIME  # [0, 1)
    return (uniform * 2 - 1) * (std * math.sqrt(3.0))


def gather_ids(ids: Tensor) -> Tensor:
    """Every rank's ``ids`` (1-D), concatenated in rank order, under DDP; ``ids`` alone else.

    Ranks may hold different numbers (the last batch); each is padded with ``FREE``, which the
    table ignores, to the largest. One small all-gather of the sizes, one of the ids.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return ids
    size = torch.tensor([ids.numel()], device=ids.device)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    longest = int(max(s.item() for s in sizes))
    padded = torch.full((longest,), FREE, dtype=torch.long, device=ids.device)
    padded[: ids.numel()] = ids
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat(parts)


def reset_optimizer_rows(
    optimizer: torch.optim.Optimizer, param: Tensor, offset: int, placement: Placement
) -> None:
    """Zero the optimizer state of the rows ``placement`` gave to new ids (local rows, at
    ``offset`` in ``param``): Adagrad's ``sum``, Adam's moments. Scalar state (Adam's ``step``)
    is per tensor and stays; a ``CombinedOptimizer``'s parts are searched too."""
    parts = getattr(optimizer, "parts", None)
    optimizers = list(parts.values()) if isinstance(parts, dict) else [optimizer]
    for part in optimizers:
        state = part.state.get(param)
        if not state:
            continue
        for value in state.values():
            if isinstance(value, Tensor) and value.shape == param.shape:
                block = value[offset:]
                placement.write(block, block.new_zeros(placement.rows.numel(), block.shape[1]))


class Placement(NamedTuple):
    """The rows an update gave to new ids, in fixed shapes (one entry per distinct id slot)."""

    rows: Tensor
    """int64: the local row given, or 0 where none was (row 0 is never given)."""
    placed: Tensor
    """bool: whether the entry's id was given ``rows``."""
    ids: Tensor
    """int64: the ids (``FREE`` in unused slots)."""

    def compacted(self) -> Placement:
        """Only the placed entries: on the CPU, where finding them costs no device wait, every
        later write and hash then works on the few new ids, not on every id slot."""
        return Placement(self.rows[self.placed], self.placed[self.placed], self.ids[self.placed])

    def write(self, block: Tensor, values: Tensor) -> None:
        """Set ``block[rows] = values`` where placed, in place and without a host sync: entries
        not placed write row 0's own value back to it."""
        keep = block[0].expand_as(values)
        block.index_put_((self.rows,), torch.where(self.placed.unsqueeze(1), values, keep))


class DynamicTable(nn.Module):
    """The id-to-row mapping of one feature's table of ``config.rows`` rows (row 0 shared).

    It holds no embedding weights: the model's fused table does (``trainers.models``), and asks
    this module which local row each id reads and which rows changed hands.
    """

    def __init__(self, config: EmbeddingConfig) -> None:
        super().__init__()
        self.config = config
        rows = config.rows
        self.rows = rows
        self.width = config.sketch_width
        self.keys: Tensor
        self.counts: Tensor
        self.last: Tensor
        self.sorted_keys: Tensor
        self.sorted_rows: Tensor
        self.sketch: Tensor
        self.sketch_time: Tensor
        self.clock: Tensor
        self.register_buffer("keys", torch.full((rows,), FREE, dtype=torch.long))
        self.register_buffer("counts", torch.zeros(rows, dtype=torch.long))
        self.register_buffer("last", torch.zeros(rows, dtype=torch.long))
        # Derived from keys, so not saved: rebuilt when a state is loaded.
        self.register_buffer("sorted_keys", torch.full((rows,), FREE, dtype=torch.long), False)
        self.register_buffer("sorted_rows", torch.arange(rows, dtype=torch.long), False)
        # One cell past the sketch's end takes the updates of ids that must not count.
        cells = _SKETCH_DEPTH * self.width + 1 if config.min_count > 1 else 1
        self.register_buffer("sketch", torch.zeros(cells, dtype=torch.long))
        self.register_buffer("sketch_time", torch.zeros(cells, dtype=torch.long))
        self.register_buffer("clock", torch.zeros((), dtype=torch.long))
        """The latest time seen: the step count, or event seconds (``ttl_unit='seconds'``)."""

    # -- reading -------------------------------------------------------------------------------

    def lookup(self, ids: Tensor) -> Tensor:
        """The local row of each id (any shape, int64): its own row, or 0 (not admitted, null)."""
        flat = ids.reshape(-1).contiguous()
        pos = torch.searchsorted(self.sorted_keys, flat).clamp_(max=self.rows - 1)
        found = (self.sorted_keys[pos] == flat) & (flat != FREE)
        return torch.where(found, self.sorted_rows[pos], 0).view(ids.shape)

    def occupied(self) -> Tensor:
        """How many rows ids hold now (a 0-d tensor: reading it waits on the device)."""
        return (self.keys != FREE).sum()

    # -- learning ------------------------------------------------------------------------------

    @torch.no_grad()
    def update(self, ids: Tensor, now: Tensor | None = None) -> Placement:
        """Count ``ids`` (every id of a training step, every rank's), expire, admit and evict.

        ``now``: the event time in seconds (0-d int64) with ``ttl_unit='seconds'``; else the
        clock is the number of updates. Returns the rows given to new ids in this update, whose
        weights and optimizer state the caller re-initialises (see :class:`Placement`).
        """
        config = self.config
        device = self.keys.device
        if now is None:
            self.clock.add_(1)
        else:
            # A clock never runs back: a late batch does not revive expired rows.
            torch.maximum(self.clock, now.to(device, torch.long), out=self.clock)
        t = self.clock
        flat = ids.reshape(-1).to(device, torch.long)
        n = flat.numel()

        expired = None
        if config.ttl is not None:  # expiry first: an id back after ttl is admitted anew
            expired = (self.keys != FREE) & (self.last < t - config.ttl)
            self.keys.masked_fill_(expired, FREE)
            self.counts.masked_fill_(expired, 0)

        # The distinct ids and their counts, in fixed shapes: sorted, FREE (no id) last.
        valid = (flat != NULL_ID) & (flat != FREE)
        ordered = torch.sort(torch.where(valid, flat, FREE)).values  # values only: unstable is fine
        first = torch.ones(n, dtype=torch.bool, device=device)
        first[1:] = ordered[1:] != ordered[:-1]
        real = ordered != FREE
        slot = torch.where(real, torch.cumsum(first & real, 0) - 1, n)
        distinct = torch.full((n + 1,), FREE, dtype=torch.long, device=device)
        distinct.scatter_(0, slot, ordered)
        seen = torch.zeros(n + 1, dtype=torch.long, device=device)
        seen.scatter_add_(0, slot, torch.ones_like(slot))
        distinct, seen = distinct[:n], seen[:n]

        rows = self.lookup(distinct)  # the index is of before expiry: expired rows are misses
        if expired is not None:
            rows = torch.where(expired[rows], 0, rows)
        hit = rows > 0
        self.counts.index_add_(0, rows, torch.where(hit, seen, 0))
        self.last.scatter_reduce_(0, rows, torch.where(hit, t, 0), "amax")
        miss = ~hit & (distinct != FREE)
        estimate = self._count_candidates(distinct, seen, miss, t)
        admit = miss & (estimate >= config.min_count)
        placement = self._place(distinct, admit, estimate, rows, hit, t)
        self._rebuild()
        return placement

    def _count_candidates(self, ids: Tensor, seen: Tensor, miss: Tensor, t: Tensor) -> Tensor:
        """Add the missed ids to the sketch; each one's estimated count (min over hashes)."""
        if self.config.min_count <= 1:
            return seen
        dump = self.sketch.numel() - 1
        cells = torch.stack(
            [hash_ids(ids, d) % self.width + d * self.width for d in range(_SKETCH_DEPTH)]
        )
        cells = torch.where(miss, cells, dump)
        if self.config.ttl is not None:
            stale = self.sketch_time < t - self.config.ttl
            self.sketch.masked_fill_(stale, 0)
        self.sketch.scatter_add_(
            0, cells.flatten(), torch.where(miss, seen, 0).repeat(_SKETCH_DEPTH)
        )
        self.sketch_time.scatter_reduce_(
            0, cells.flatten(), torch.where(miss, t, 0).repeat(_SKETCH_DEPTH), "amax"
        )
        self.sketch[dump] = 0
        return self.sketch[cells].amin(dim=0)

    def _place(
        self, ids: Tensor, admit: Tensor, estimate: Tensor, rows: Tensor, hit: Tensor, t: Tensor
    ) -> Placement:
        """Give the admitted ids rows: free ones first (by index), then by the eviction policy;
        never row 0 nor a row an id of this step holds. Ids past the rows left wait (row 0)."""
        size = self.rows
        device = self.keys.device
        busy = torch.zeros(size, dtype=torch.bool, device=device)
        busy.scatter_(0, rows, hit)
        busy[0] = True
        free = self.keys == FREE
        # One distinct int64 key per row: class (free 0, evictable 1, busy 2), the policy's two
        # keys (15 bits each: ages and counts past 32,767 tie), the row. Distinct keys make the
        # smallest k the same on any device and any run, without a stable sort of every row.
        limit = 2**15 - 1
        age = (t - self.last).clamp(0, limit)
        often = self.counts.clamp(0, limit)
        if self.config.eviction == "lru":
            first, second = limit - age, often
        else:
            first, second = often, limit - age
        grade = torch.where(busy, 2, torch.where(free, 0, 1))
        index = torch.arange(size, device=device)
        key = (grade << 61) | (first << 46) | (second << 31) | index
        wanted = min(ids.numel(), size)  # never more admissions than distinct ids
        order = torch.topk(key, wanted, largest=False, sorted=True).indices
        available = (grade < 2).sum()
        rank = torch.cumsum(admit.long(), 0) - 1
        placed = admit & (rank < available) & (rank < wanted)
        target = order[rank.clamp(0, max(wanted - 1, 0))] if wanted else rank.clamp(0, 0)
        # The ids not placed write to a spare slot past the end, dropped after.
        target = torch.where(placed, target, size)
        spare = torch.full((1,), FREE, dtype=torch.long, device=device)
        self.keys.copy_(torch.cat([self.keys, spare]).scatter_(0, target, ids)[:size])
        counted = torch.cat([self.counts, spare]).scatter_(0, target, estimate)[:size]
        self.counts.copy_(counted)
        stamped = torch.cat([self.last, spare]).scatter_(0, target, t.expand_as(target))[:size]
        self.last.copy_(stamped)
        return Placement(torch.where(placed, target, 0), placed, ids)

    def _rebuild(self) -> None:
        # Unstable is enough (and on the CPU far faster): held keys are distinct, and where
        # the FREE rows land in the index no lookup can tell.
        ordered = torch.sort(self.keys)
        self.sorted_keys.copy_(ordered.values)
        self.sorted_rows.copy_(ordered.indices)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        with torch.no_grad():
            self._rebuild()


def _hashed(ids: Tensor, rows: int) -> Tensor:
    """A trainer-hashed Id feature's rows: ``1 + hash mod (rows - 1)``, 0 for null."""
    index = 1 + hash_ids(ids, 3) % (rows - 1)
    return torch.where((ids == NULL_ID) | (ids == FREE), 0, index)


class IdTables(nn.Module):
    """How the layout's ``Id`` features (column ``ids``) find their rows: each as its
    :class:`~flow.training.EmbeddingConfig` in ``ModelConfig.embeddings`` says, ``hashed`` into
    ``max_embedding_rows`` rows when it has none.

    ``forward(batch, update=...)`` gives the local row of every id, ``[B, n_ids]``; with
    ``update`` the dynamic tables learn the batch's ids first, and :meth:`placed` tells the model
    which rows changed hands.
    """

    def __init__(self, config: ModelConfig, layout: Layout) -> None:
        super().__init__()
        chosen = {e.feature: e for e in config.embeddings}
        unknown = [name for name in chosen if name not in layout.ids]
        if unknown:
            sparse = {name for name, _ in layout.sparse}
            name = unknown[0]
            if name in sparse:
                raise ConfigError(
                    f"ModelConfig.embeddings names {name!r}, which the pipeline already hashes "
                    f"or indexes (a sparse feature); declare it Id({name!r}) in the feature "
                    "spec to give it a table of raw ids"
                )
            raise ConfigError(
                f"ModelConfig.embeddings names {name!r}, which is no Id feature of the "
                f"channel's layout; its Id features: {', '.join(layout.ids) or 'none'}"
                f"{did_you_mean(name, list(layout.ids))}"
            )
        self.names = layout.ids
        self.choices = tuple(
            chosen.get(name)
            or EmbeddingConfig(name, kind="hashed", rows=max(2, config.max_embedding_rows))
            for name in layout.ids
        )
        self.rows: tuple[int, ...] = tuple(c.rows for c in self.choices)
        self.tables = nn.ModuleDict(
            {c.feature: DynamicTable(c) for c in self.choices if c.kind == "dynamic"}
        )
        self._placed: dict[int, Placement] = {}
        self.compact = True
        """Compact placements on the CPU (off: the fixed-shape path a GPU takes, for tests)."""

    def forward(self, batch: Mapping[str, Tensor], *, update: bool) -> Tensor:
        ids = batch["ids"]
        device = next(iter(self.buffers()), torch.empty(0)).device
        ids = ids.to(device=device, dtype=torch.long) if self.tables else ids.long()
        columns = []
        for k, choice in enumerate(self.choices):
            column = ids[:, k].contiguous()
            if choice.kind == "hashed":
                columns.append(_hashed(column, choice.rows))
                continue
            table = cast(DynamicTable, self.tables[choice.feature])
            if update:
                now = self._now(batch, choice) if choice.ttl_unit == "seconds" else None
                placement = table.update(gather_ids(column), now)
                cpu = placement.rows.device.type == "cpu"
                self._placed[k] = placement.compacted() if cpu and self.compact else placement
            columns.append(table.lookup(column))
        return torch.stack(columns, dim=1)

    @staticmethod
    def _now(batch: Mapping[str, Tensor], choice: EmbeddingConfig) -> Tensor:
        """The latest event time of the step, in seconds, over every rank."""
        if choice.time_column not in batch:
            raise SchemaMismatchError(
                f"the dynamic table of {choice.feature!r} expires by event time (ttl_unit="
                f"'seconds') from column {choice.time_column!r}, which the batch lacks; pass it "
                "through in the feature spec or set ttl_unit='steps'"
            )
        times = batch[choice.time_column].reshape(-1).to(torch.long)
        latest = gather_ids(times.max().reshape(1)).max()
        return torch.div(latest, 1_000_000, rounding_mode="floor")

    def placed(self) -> list[tuple[int, Placement]]:
        """(Id feature index, placement) of the last update of each dynamic table."""
        return sorted(self._placed.items())

    def forget_placed(self) -> None:
        self._placed.clear()
