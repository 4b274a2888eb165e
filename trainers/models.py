"""CTR models over a handoff batch: DeepFM, DLRM and Wide & Deep, chosen by :class:`ModelConfig`
(the baselines, hashed logistic regression and popularity, are in ``trainers.baselines``).

A model is built from the :class:`~flow.pipeline.state.Layout` that Spark wrote the rows with, so
its tables have exactly the sizes the indices need. Every model reads the same batch::

    label   float32 [B]                 (read by the loss, not by the model)
    dense   float32 [B, n_dense]        (absent when the layout has no dense features)
    sparse  int64 or int32 [B, n_sparse]   column j in [0, cardinality_j); 0 = null/OOV
    seq_<name>  int64 [B, length]       in [0, cardinality); 0 = padding
    ids     int64 [B, n_ids]            raw 64-bit ids of ``Id`` features (``trainers.dynamic``)

and returns float32 logits ``[B]``. Models are device-agnostic (they follow their parameters),
run under ``torch.autocast`` and trace under ``torch.compile`` without graph breaks: the forward
has no data-dependent Python branches, only checks on shapes and dtypes.

(One module past 400 lines: the three models share the fused embedding and the MLP builder, and
read best beside them; the baselines, which share neither, have their own module.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flow.errors import ConfigError, SchemaMismatchError
from flow.pipeline.state import Layout
from flow.training import MODEL_NAMES, ModelConfig
from trainers.dynamic import IdTables, initial_rows, reset_optimizer_rows

__all__ = [
    "DLRM",
    "CTRModel",
    "DeepFM",
    "FieldEmbeddings",
    "ModelConfig",
    "WideDeep",
    "build_model",
]


# Small enough that FM's ~F²/2 pairwise dot products start near zero, not as a noisy logit.
_INIT_STD = 0.01


def _check_layout(layout: Layout) -> None:
    if not (layout.dense or layout.sparse or layout.sequences or layout.ids):
        raise ConfigError("the layout has no features; a model needs at least one")
    for name, cardinality in layout.sparse:
        if cardinality < 1:
            raise ConfigError(f"sparse feature {name!r} has cardinality {cardinality}; need >= 1")
    for name, cardinality, length in layout.sequences:
        if cardinality < 1 or length < 1:
            raise ConfigError(
                f"sequence feature {name!r} has cardinality {cardinality} and length {length}; "
                "both must be >= 1"
            )


class FieldEmbeddings(nn.Module):
    """One vector per categorical field: every sparse and sequence feature's table in one weight.

    Feature ``k`` (the sparse features in layout order, then the sequences) owns rows
    ``offsets[k] : offsets[k] + rows[k]`` of ``weight``, with ``rows[k] = min(cardinality,
    max_rows)``; its id ``i`` is row ``offsets[k] + i % rows[k]``. Each table keeps its own size,
    but the lookup is one ``embedding_bag`` kernel for all fields, as torchrec's fused
    EmbeddingBagCollection does: 26 small tables would be 26 kernel launches forward and again
    backward, which at CTR batch sizes costs more than the gathers themselves.

    A sparse field is a bag of one id. A sequence is a bag of its ids weighted ``1/n`` over its
    ``n`` non-padding positions: the mean of their vectors, zeros when all are padding (index 0).
    The ``[B, length, dim]`` gather is never materialised.

    An ``Id`` feature (``id_rows``: its table's rows, after the sparse features) is a bag of
    one row too, whose local row the model found for its raw id (``_id_rows`` in the batch, see
    :meth:`CTRModel.with_id_rows`).

    The output is ``[B, n_sparse + n_ids + n_sequences, dim]``.
    """

    def __init__(
        self,
        layout: Layout,
        dim: int,
        max_rows: int,
        init_std: float = _INIT_STD,
        id_rows: Sequence[int] = (),
    ):
        super().__init__()
        sparse = [min(c, max_rows) for _, c in layout.sparse]
        rows = [*sparse, *id_rows] + [min(c, max_rows) for _, c, _ in layout.sequences]
        offsets = [sum(rows[:k]) for k in range(len(rows))]
        self.dim = dim
        self.init_std = init_std
        self.n_ids = len(id_rows)
        self.id_rows: tuple[int, ...] = tuple(id_rows)
        self.n_sparse = len(layout.sparse)
        self.rows: tuple[int, ...] = tuple(rows)
        self.offsets: tuple[int, ...] = tuple(offsets)
        self.sequences: tuple[tuple[str, int], ...] = tuple(
            (f"seq_{name}", length) for name, _, length in layout.sequences
        )
        self.weight = nn.Parameter(torch.empty(sum(rows), dim))
        if init_std > 0:
            nn.init.normal_(self.weight, std=init_std)
        else:
            nn.init.zeros_(self.weight)
        n = self.n_sparse
        # Buffers, not Python lists: they follow the module to its device.
        self._sparse_rows: Tensor
        self._sparse_offsets: Tensor
        self._bag_starts: Tensor
        self.register_buffer("_sparse_rows", torch.tensor(rows[:n], dtype=torch.long), False)
        self.register_buffer("_sparse_offsets", torch.tensor(offsets[:n], dtype=torch.long), False)
        self._id_offsets: Tensor
        id_offsets = offsets[n : n + self.n_ids]
        self.register_buffer("_id_offsets", torch.tensor(id_offsets, dtype=torch.long), False)
        lengths = [1] * (n + self.n_ids) + [length for _, length in self.sequences]
        starts = [sum(lengths[:k]) for k in range(len(lengths))]
        self.width = sum(lengths)
        self.register_buffer("_bag_starts", torch.tensor(starts, dtype=torch.long), False)

    @property
    def n_fields(self) -> int:
        return self.n_sparse + self.n_ids + len(self.sequences)

    def id_block(self, k: int) -> Tensor:
        """The rows of ``weight`` owned by ``Id`` feature ``k`` (a view)."""
        start = self.offsets[self.n_sparse + k]
        return self.weight.data[start : start + self.rows[self.n_sparse + k]]

    def _indices(self, batch: Mapping[str, Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        """Table rows of every lookup and the masks of the sequences (True = not padding)."""
        device = self.weight.device
        parts: list[Tensor] = []
        masks: list[Tensor] = []
        if self.n_sparse:
            sparse = batch["sparse"].to(device=device, dtype=torch.long)
            parts.append(sparse % self._sparse_rows + self._sparse_offsets)
        if self.n_ids:
            parts.append(batch["_id_rows"].to(device=device, dtype=torch.long) + self._id_offsets)
        for k, (column, _) in enumerate(self.sequences, start=self.n_sparse + self.n_ids):
            ids = batch[column].to(device=device, dtype=torch.long)
            masks.append(ids != 0)
            parts.append(ids % self.rows[k] + self.offsets[k])
        return parts, masks

    def forward(self, batch: Mapping[str, Tensor]) -> Tensor:
        parts, masks = self._indices(batch)
        rows = torch.cat(parts, dim=1)
        size = rows.shape[0]
        dtype = self.weight.dtype
        singles = self.n_sparse + self.n_ids
        weights = [torch.ones(size, singles, device=rows.device, dtype=dtype)]
        for mask in masks:
            present = mask.to(dtype)
            weights.append(present / present.sum(dim=1, keepdim=True).clamp(min=1.0))
        offsets = (
            torch.arange(size, device=rows.device).unsqueeze(1) * self.width + self._bag_starts
        ).flatten()
        pooled = F.embedding_bag(
            rows.flatten(),
            self.weight,
            offsets,
            mode="sum",
            per_sample_weights=torch.cat(weights, dim=1).flatten(),
        )
        return pooled.view(size, self.n_fields, self.dim)

    def looked_up(self, batch: Mapping[str, Tensor]) -> Tensor:
        """The rows of ``weight`` the batch reads, flat, one entry per use (padding left out).

        ``torch.unique(..., return_counts=True)`` of it gives each row's count in the batch, the
        ``cnt`` of CowClip.
        """
        parts, masks = self._indices(batch)
        # parts: the sparse block and the id block (one tensor each) if any, then sequences
        singles = int(self.n_sparse > 0) + int(self.n_ids > 0)
        sequences = parts[singles:]
        flat = [part.flatten() for part in parts[:singles]]
        flat += [ids[mask] for ids, mask in zip(sequences, masks, strict=True)]
        return (
            torch.cat(flat) if flat else torch.empty(0, dtype=torch.long, device=self.weight.device)
        )


def _mlp(width: int, sizes: Sequence[int], dropout: float, *, last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for k, size in enumerate(sizes):
        layers.append(nn.Linear(width, size))
        width = size
        if k < len(sizes) - 1 or last_relu:
            layers.append(nn.ReLU())
            if dropout and k < len(sizes) - 1:
                layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


class CTRModel(nn.Module):
    """A CTR model: ``model(batch)`` is the logits ``[B]`` of a batch dict.

    Parameters come in two kinds an optimizer treats differently: :meth:`embedding_parameters`
    (per-id tables; each step touches a few rows) and :meth:`dense_parameters` (everything else).
    """

    def __init__(
        self,
        config: ModelConfig,
        layout: Layout,
        *,
        tables: Layout | None = None,
        width: int | None = None,
        init_std: float = _INIT_STD,
    ) -> None:
        """``tables``, ``width`` and ``init_std``: the embedding table's fields (default: every
        categorical field of ``layout``), width (default: ``config.embedding_dim``) and
        initial spread; the baselines' tables differ (``trainers.baselines``)."""
        super().__init__()
        _check_layout(layout)
        self.config = config
        self.layout = layout
        self.n_dense = len(layout.dense)
        # The Id features' tables (raw ids): their rows and the mappings of the dynamic ones.
        self.id_tables = IdTables(config, layout) if layout.ids and tables is None else None
        rows = self.id_tables.rows if self.id_tables is not None else ()
        self.embeddings = FieldEmbeddings(
            tables or layout,
            width or config.embedding_dim,
            config.max_embedding_rows,
            init_std=init_std,
            id_rows=rows,
        )

    def forward(self, batch: Mapping[str, Tensor]) -> Tensor:
        self.check_batch(batch)
        # Train mode counts, admits and evicts ids; eval mode (scoring, export) only looks up.
        return self.logits(self.with_id_rows(batch, update=self.training)).float()

    def with_id_rows(self, batch: Mapping[str, Tensor], *, update: bool) -> Mapping[str, Tensor]:
        """``batch`` with ``_id_rows``, the local table row of each raw id (``ids``); with
        ``update``, the dynamic tables first learn the batch's ids (every rank's, under DDP)
        and the rows they give to new ids are re-initialised in every table of the model."""
        if self.id_tables is None:
            return batch
        rows = self.id_tables(batch, update=update)
        if update:
            with torch.no_grad():
                for k, placement in self.id_tables.placed():
                    for table in self.embedding_tables():
                        block = table.id_block(k)
                        values = initial_rows(placement.ids, table.dim, table.init_std, salt=k)
                        placement.write(block, values.to(block.dtype))
        return {**batch, "_id_rows": rows}

    def reset_new_rows(self, optimizer: torch.optim.Optimizer) -> None:
        """Zero the optimizer state of the rows the last training forward gave to new ids
        (call it between that forward and ``optimizer.step()``): a reused row must not carry
        its previous id's Adagrad sums or Adam moments."""
        if self.id_tables is None:
            return
        for k, placement in self.id_tables.placed():
            for table in self.embedding_tables():
                offset = table.offsets[table.n_sparse + k]
                reset_optimizer_rows(optimizer, table.weight, offset, placement)
        self.id_tables.forget_placed()

    def logits(self, batch: Mapping[str, Tensor]) -> Tensor:
        """The model proper, on a batch already checked."""
        raise NotImplementedError

    def _dense(self, batch: Mapping[str, Tensor]) -> Tensor:
        weight = self.embeddings.weight
        return batch["dense"].to(device=weight.device, dtype=weight.dtype)

    def _expected(self) -> list[tuple[str, int, bool]]:
        columns = []
        if self.layout.dense:
            columns.append(("dense", len(self.layout.dense), False))
        if self.layout.sparse:
            columns.append(("sparse", len(self.layout.sparse), True))
        if self.layout.ids:
            columns.append(("ids", len(self.layout.ids), True))
        columns += [(f"seq_{name}", length, True) for name, _, length in self.layout.sequences]
        return columns

    def check_batch(self, batch: Mapping[str, Tensor]) -> None:
        """Raise :class:`SchemaMismatchError` unless the batch has every column the layout needs,
        each ``[B, width]`` with the right width and kind. Shapes and dtypes only: no device sync.
        """
        rows: dict[str, int] = {}
        for column, width, integer in self._expected():
            if column not in batch:
                raise SchemaMismatchError(
                    f"the batch has no column {column!r}, which the model's layout needs; "
                    f"it has {', '.join(sorted(batch)) or 'no columns'}"
                )
            tensor = batch[column]
            if tensor.dim() != 2 or tensor.shape[1] != width:
                raise SchemaMismatchError(
                    f"batch column {column!r} has shape {tuple(tensor.shape)}; the layout "
                    f"expects [batch, {width}]"
                )
            if integer and tensor.dtype not in (torch.int64, torch.int32):
                raise SchemaMismatchError(
                    f"batch column {column!r} is {tensor.dtype}; expected int64 or int32 indices"
                )
            if not integer and not tensor.dtype.is_floating_point:
                raise SchemaMismatchError(
                    f"batch column {column!r} is {tensor.dtype}; expected floats"
                )
            rows[column] = tensor.shape[0]
        if len(set(rows.values())) > 1:
            counts = ", ".join(f"{column} {n}" for column, n in rows.items())
            raise SchemaMismatchError(f"batch columns have different numbers of rows: {counts}")

    def check_indices(self, batch: Mapping[str, Tensor]) -> None:
        """Raise :class:`SchemaMismatchError` if an index lies outside ``[0, cardinality)``.

        The forward does not check values (that would wait on the GPU every step), and wraps an
        out-of-range id into its own feature's rows rather than failing. Call this on a first
        batch, or when debugging, to catch a layout that does not match the data.
        """
        self.check_batch(batch)
        if self.layout.sparse:
            sparse = batch["sparse"]
            limits = torch.tensor([c for _, c in self.layout.sparse], device=sparse.device)
            bad = ((sparse < 0) | (sparse >= limits)).any(dim=0)
            if bool(bad.any()):
                names = [n for (n, _), b in zip(self.layout.sparse, bad.tolist(), strict=True) if b]
                raise SchemaMismatchError(
                    f"sparse features {', '.join(names)} have indices outside [0, cardinality)"
                )
        for name, cardinality, _ in self.layout.sequences:
            ids = batch[f"seq_{name}"]
            if bool(((ids < 0) | (ids >= cardinality)).any()):
                raise SchemaMismatchError(
                    f"sequence feature {name!r} has indices outside [0, {cardinality})"
                )

    def embedding_tables(self) -> list[FieldEmbeddings]:
        """Every per-id table of the model (a dense-only layout has an empty one)."""
        return [m for m in self.modules() if isinstance(m, FieldEmbeddings)]

    def embedding_parameters(self) -> list[nn.Parameter]:
        """The per-id tables (rows indexed by feature ids)."""
        return [t.weight for t in self.embedding_tables()]

    def dense_parameters(self) -> list[nn.Parameter]:
        """Every parameter that is not an embedding table."""
        tables = {id(p) for p in self.embedding_parameters()}
        return [p for p in self.parameters() if id(p) not in tables]

    def embedding_rows(self, batch: Mapping[str, Tensor]) -> list[tuple[nn.Parameter, Tensor]]:
        """Each table with the rows the batch reads (see :meth:`FieldEmbeddings.looked_up`)."""
        batch = self.with_id_rows(batch, update=False)
        return [(t.weight, t.looked_up(batch)) for t in self.embedding_tables()]


class _Linear(nn.Module):
    """The first-order term: a scalar per id (1-wide tables, mean over a sequence) + dense."""

    def __init__(self, layout: Layout, max_rows: int, id_rows: Sequence[int] = ()) -> None:
        super().__init__()
        self.n_fields = len(layout.sparse) + len(id_rows) + len(layout.sequences)
        self.ids = (
            FieldEmbeddings(layout, 1, max_rows, init_std=0.0, id_rows=id_rows)
            if self.n_fields
            else None
        )
        self.dense = nn.Linear(len(layout.dense), 1) if layout.dense else None
        self.bias = None if layout.dense else nn.Parameter(torch.zeros(1))

    def forward(self, batch: Mapping[str, Tensor], dense: Tensor | None) -> Tensor:
        terms: list[Tensor] = []
        if self.dense is not None and dense is not None:
            terms.append(self.dense(dense).squeeze(1))
        if self.ids is not None:
            terms.append(self.ids(batch).sum(dim=(1, 2)))
        if self.bias is not None:
            terms.append(self.bias)
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        return total


class DeepFM(CTRModel):
    """DeepFM (Guo et al., 2017): first-order + factorization machine + deep MLP.

    Each dense value ``x_k`` is a field of its own with a learnt vector ``v_k``, embedded as
    ``x_k v_k`` (Rendle's FM over real-valued features), so the FM learns every dense-id and
    dense-dense interaction with a vector per feature; projecting the whole dense block to one
    field would mix them into one vector first. The deep part reads the id embeddings and the raw
    dense values.
    """

    def __init__(self, config: ModelConfig, layout: Layout) -> None:
        super().__init__(config, layout)
        dim = config.embedding_dim
        self.linear = _Linear(layout, config.max_embedding_rows, self.embeddings.id_rows)
        self.dense_vectors = (
            nn.Parameter(torch.randn(self.n_dense, dim) * _INIT_STD) if self.n_dense else None
        )
        width = self.embeddings.n_fields * dim + self.n_dense
        self.deep = _mlp(width, [*config.hidden, 1], config.dropout, last_relu=False)

    def logits(self, batch: Mapping[str, Tensor]) -> Tensor:
        dense = self._dense(batch) if self.n_dense else None
        deep_in: list[Tensor] = []
        fm_in: list[Tensor] = []
        if self.embeddings.n_fields:
            fields = self.embeddings(batch)
            deep_in.append(fields.flatten(1))
            fm_in.append(fields)
        if dense is not None and self.dense_vectors is not None:
            deep_in.append(dense)
            fm_in.append(dense.unsqueeze(2) * self.dense_vectors)
        every = torch.cat(fm_in, dim=1)
        # sum_{i<j} <e_i, e_j> = ((sum e)^2 - sum e^2) / 2, in O(fields * dim)
        fm = 0.5 * (every.sum(dim=1).square() - every.square().sum(dim=1)).sum(dim=1)
        deep: Tensor = self.deep(torch.cat(deep_in, dim=1))
        linear: Tensor = self.linear(batch, dense)
        return linear + fm + deep.squeeze(1)


class WideDeep(CTRModel):
    """Wide & Deep (Cheng et al., 2016): a linear model over ids and dense values + a deep MLP.

    The wide part is one weight per id (no hand-made crosses: a ``Cross`` feature of the spec
    already arrives as its own sparse column).
    """

    def __init__(self, config: ModelConfig, layout: Layout) -> None:
        super().__init__(config, layout)
        self.wide = _Linear(layout, config.max_embedding_rows, self.embeddings.id_rows)
        width = self.embeddings.n_fields * config.embedding_dim + self.n_dense
        self.deep = _mlp(width, [*config.hidden, 1], config.dropout, last_relu=False)

    def logits(self, batch: Mapping[str, Tensor]) -> Tensor:
        dense = self._dense(batch) if self.n_dense else None
        deep_in = [self.embeddings(batch).flatten(1)] if self.embeddings.n_fields else []
        if dense is not None:
            deep_in.append(dense)
        wide: Tensor = self.wide(batch, dense)
        deep: Tensor = self.deep(torch.cat(deep_in, dim=1))
        return wide + deep.squeeze(1)


class DLRM(CTRModel):
    """DLRM (Naumov et al., 2019): bottom MLP, pairwise dot products, top MLP.

    The bottom MLP maps the dense block to one ``embedding_dim`` vector; the dot products of
    every pair of (that vector and the field embeddings), upper triangle without the diagonal,
    are concatenated with it and go through the top MLP. Without dense features there is no
    bottom MLP and the top MLP reads the dot products alone.
    """

    def __init__(self, config: ModelConfig, layout: Layout) -> None:
        super().__init__(config, layout)
        dim = config.embedding_dim
        vectors = self.embeddings.n_fields + (1 if self.n_dense else 0)
        if not self.n_dense and self.embeddings.n_fields < 2:
            raise ConfigError(
                "dlrm needs dense features or at least two sparse/sequence features to interact"
            )
        self.bottom = (
            _mlp(self.n_dense, [*config.bottom, dim], config.dropout, last_relu=True)
            if self.n_dense
            else None
        )
        upper = torch.triu_indices(vectors, vectors, offset=1)
        self._pairs: Tensor
        self.register_buffer("_pairs", upper[0] * vectors + upper[1], persistent=False)
        width = upper.shape[1] + (dim if self.n_dense else 0)
        self.top = _mlp(width, [*config.hidden, 1], config.dropout, last_relu=False)

    def logits(self, batch: Mapping[str, Tensor]) -> Tensor:
        vectors = [self.embeddings(batch)] if self.embeddings.n_fields else []
        top_in = []
        if self.bottom is not None:
            bottom = self.bottom(self._dense(batch))
            vectors.insert(0, bottom.unsqueeze(1))
            top_in.append(bottom)
        stacked = torch.cat(vectors, dim=1) if len(vectors) > 1 else vectors[0]
        products = torch.bmm(stacked, stacked.transpose(1, 2))
        top_in.append(products.flatten(1)[:, self._pairs])
        top = torch.cat(top_in, dim=1) if len(top_in) > 1 else top_in[0]
        logits: Tensor = self.top(top)
        return logits.squeeze(1)


def _models() -> dict[str, type[CTRModel]]:
    # The baselines subclass CTRModel, so their module is imported when first needed.
    from trainers.baselines import Logistic, Popularity

    models: dict[str, type[CTRModel]] = {
        "deepfm": DeepFM,
        "dlrm": DLRM,
        "wide_deep": WideDeep,
        "logistic": Logistic,
        "popularity": Popularity,
    }
    if set(models) != set(MODEL_NAMES):  # the names are defined once, in flow.training
        raise ImportError(f"trainers build {sorted(models)}; flow.training names {MODEL_NAMES}")
    return models


def build_model(config: ModelConfig, layout: Layout) -> CTRModel:
    """The model ``config`` names, with tables sized from ``layout``."""
    return _models()[config.name](config, layout)
