"""The fitted feature state applied without Spark: numpy and pyarrow over raw rows.

:class:`FeatureTransform` turns a table of a stage's feature inputs (the events' columns after
the label join, the enrichments and the Derived columns) into the training-row columns that
``spark_jobs.features`` compiles to Spark SQL: ``dense`` (float32), ``sparse`` (int32), one
``seq_<name>`` per sequence feature, ``ids`` (int64, the raw ids of ``Id`` features) where there
are any, and ``label`` and ``weight`` where their columns are given.
It is the serving side of "one feature transform, two executions"; the consistency check
(:mod:`flow.transform.consistency`) holds the two to the same values on committed rows.

Each step follows the compiled expression it mirrors, including where Spark's semantics are
not numpy's: NaN is larger than every number in ``greatest``/``least`` and comparisons, a null
stays null through clip and log, ``log1p`` is fdlibm's, hashes are Spark's chained XXH64 (see
:mod:`flow.transform.spark_semantics`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flow.errors import ConfigError
from flow.pipeline.features import (
    NULL_ID,
    Bucketized,
    Cross,
    Feature,
    FeatureSpec,
    Hashed,
    HashedSequence,
    Id,
    Numeric,
    Vocabulary,
    feature_inputs,
    feature_name,
)
from flow.pipeline.model import Pipeline
from flow.pipeline.state import FeatureState, layout
from flow.transform.spark_semantics import log1p, string_of, xxhash64

__all__ = ["FeatureTransform"]

_NULL = "\u0000".encode()
"""A Cross's stand-in for a null part (spark_jobs.features._NULL)."""


def _floats(table: pa.Table, column: str) -> tuple[np.ndarray, np.ndarray]:
    """``cast(column AS double)`` as values and a null mask."""
    # Unchecked: a long past 2^53 rounds to the nearest double, as Java's (double) cast does.
    array = pc.cast(table.column(column).combine_chunks(), pa.float64(), safe=False)
    values: np.ndarray = array.to_numpy(zero_copy_only=False)  # a null comes as NaN here
    if not array.null_count:  # the common case of a served row: no mask to build
        return values, np.zeros(len(values), dtype=bool)
    nulls: np.ndarray = array.is_null().to_numpy(zero_copy_only=False)
    return np.where(nulls, 0.0, values), nulls


def _clipped_and_logged(feature: Numeric | Bucketized, x: np.ndarray) -> np.ndarray:
    """``least(greatest(x, low), high)`` then ``log1p(greatest(x, 0))`` as Spark orders doubles:
    NaN above every number, so a NaN clips to ``high`` and stays NaN under ``greatest``."""
    if feature.clip is not None:
        low, high = float(feature.clip[0]), float(feature.clip[1])
        x = np.where(x < low, low, x)
        x = np.where((x > high) | np.isnan(x), high, x)
    if feature.log:
        x = np.where(x < 0.0, 0.0, x)
        unique, where = np.unique(x, return_inverse=True)
        x = np.array([log1p(float(v)) for v in unique], dtype=np.float64)[where.reshape(-1)]
    return x


def _text(values: list[Any]) -> list[bytes | None]:
    return [None if v is None else string_of(v).encode() for v in values]


def _hash_index(name: bytes, buckets: int, *parts: bytes | None) -> int:
    return 1 + xxhash64(name, *parts) % (buckets - 1)


class FeatureTransform:
    """A spec and its fitted state, ready to featurize Arrow tables of raw feature inputs."""

    def __init__(self, spec: FeatureSpec, state: FeatureState) -> None:
        self.spec = spec
        self.state = state
        self.layout = layout(spec, state)  # raises if the state does not fit the spec
        # Once: a served model applies the transform to one row at a time.
        self._inputs = tuple(dict.fromkeys(c for f in spec.features for c in feature_inputs(f)))
        self._vocabularies = {
            name: {value: i + 1 for i, value in enumerate(values)}
            for name, values in state.vocabularies.items()
        }

    @classmethod
    def for_stage(cls, pipeline: Pipeline, stage: str, state: FeatureState) -> FeatureTransform:
        """The transform of ``stage``'s features; a ConfigError if its features cannot be
        applied outside Spark (``pipeline.outside_spark``, found when the pipeline was built).

        Its inputs are the stage's columns after the label join, the enrichments and the
        Derived columns: a Derived column is a Spark SQL expression, which the caller computes
        (the consistency check takes it from Spark)."""
        reasons = pipeline.outside_spark[pipeline.stage(stage).name]
        if reasons:
            raise ConfigError(
                f"stage {stage!r} of pipeline {pipeline.name!r} cannot be featurized outside "
                "Spark: " + "; ".join(reasons)
            )
        return cls(pipeline.stage(stage).features, state)

    @property
    def inputs(self) -> list[str]:
        """The columns :meth:`apply` reads (label and weight only if given)."""
        return list(self._inputs)

    def apply(self, table: pa.Table) -> pa.Table:
        """The training-row columns of ``table``'s rows, in the channel's layout."""
        missing = [c for c in self._inputs if c not in table.column_names]
        if missing:
            raise ConfigError(
                f"feature spec {self.spec.name!r} reads column(s) {', '.join(missing)}, which "
                f"the rows lack; they have: {', '.join(table.column_names)}"
            )
        n = table.num_rows
        out: dict[str, pa.Array] = {}
        spec = self.spec
        if spec.label in table.column_names:
            out["label"] = table.column(spec.label).combine_chunks().cast(pa.float32())
        if isinstance(spec.weight, str):
            if spec.weight in table.column_names:
                out["weight"] = table.column(spec.weight).combine_chunks().cast(pa.float32())
        else:
            out["weight"] = pa.array(np.full(n, spec.weight, dtype=np.float32))
        dense = [self._dense(f, table) for f in spec.features if isinstance(f, Numeric)]
        sparse = [
            self._sparse(f, table)
            for f in spec.features
            if isinstance(f, Hashed | Vocabulary | Bucketized | Cross)
        ]
        out["dense"] = _fixed(np.stack(dense, axis=1) if dense else np.zeros((n, 0), np.float32))
        out["sparse"] = _fixed(np.stack(sparse, axis=1) if sparse else np.zeros((n, 0), np.int32))
        for feature in spec.features:
            if isinstance(feature, HashedSequence):
                out[f"seq_{feature_name(feature)}"] = _fixed(self._sequence(feature, table))
        ids = [self._id(f, table) for f in spec.features if isinstance(f, Id)]
        if ids:  # the raw ids, as Spark passes them: the model's tables map them
            out["ids"] = _fixed(np.stack(ids, axis=1))
        return pa.table(out)

    def _id(self, feature: Id, table: pa.Table) -> np.ndarray:
        """``coalesce(cast(column AS bigint), NULL_ID)``: an Id's column is an integer one."""
        values = pc.cast(table.column(feature.column).combine_chunks(), pa.int64())
        filled: np.ndarray = pc.fill_null(values, NULL_ID).to_numpy(zero_copy_only=False)
        return filled.astype(np.int64)

    def _dense(self, feature: Numeric, table: pa.Table) -> np.ndarray:
        name = feature_name(feature)
        raw, nulls = _floats(table, feature.column)
        x = _clipped_and_logged(feature, raw)
        mean, std = self.state.moments.get(name, (0.0, 1.0))
        fill = float(feature.fill) if feature.fill is not None else mean
        x = np.where(nulls, fill, x)
        if feature.standardize:
            x = (x - mean) / (std if std > 0 else 1.0)
        return x.astype(np.float32)

    def _sparse(self, feature: Feature, table: pa.Table) -> np.ndarray:
        name = feature_name(feature)
        if isinstance(feature, Bucketized):
            raw, nulls = _floats(table, feature.column)
            x = _clipped_and_logged(feature, raw)
            bounds = np.asarray(self.state.boundaries[name], dtype=np.float64)
            # 1 + the cut points <= x; NaN, above every number in Spark, is past all of them.
            index = np.where(np.isnan(x), len(bounds), np.searchsorted(bounds, x, side="right"))
            return np.where(nulls, 0, index + 1).astype(np.int32)
        if isinstance(feature, Vocabulary):
            known = self._vocabularies[name]
            values = table.column(feature.column).to_pylist()
            return np.array(
                [0 if v is None else known.get(string_of(v), 0) for v in values], np.int32
            )
        key = name.encode()
        if isinstance(feature, Hashed):
            texts = _text(table.column(feature.column).to_pylist())
            return np.array(
                [0 if t is None else _hash_index(key, feature.buckets, t) for t in texts], np.int32
            )
        if isinstance(feature, Cross):
            columns = [_text(table.column(c).to_pylist()) for c in feature.columns]
            return np.array(
                [
                    _hash_index(key, feature.buckets, *(_NULL if p is None else p for p in parts))
                    for parts in zip(*columns, strict=True)
                ],
                np.int32,
            )
        raise TypeError(f"{name} is not a categorical feature")

    def _sequence(self, feature: HashedSequence, table: pa.Table) -> np.ndarray:
        key = feature_name(feature).encode()
        rows = table.column(feature.column).to_pylist()
        out = np.zeros((len(rows), feature.max_length), np.int32)
        for i, values in enumerate(rows):
            for j, text in enumerate(_text((values or [])[: feature.max_length])):
                out[i, j] = 0 if text is None else _hash_index(key, feature.buckets, text)
        return out


def _fixed(values: np.ndarray) -> pa.Array:
    """A block of features as the channel holds it: fixed-size lists, or, for a block with no
    features (a spec without dense ones), lists of nothing, as Spark's writer leaves them."""
    if values.shape[1] == 0:
        return pa.array([[]] * values.shape[0], pa.list_(pa.from_numpy_dtype(values.dtype)))
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
