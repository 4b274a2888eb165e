"""Spark's training rows against the Python transform of their raw inputs, feature by feature.

:func:`compare` is the reusable part: two Arrow tables of training-row columns, row for row,
and a :class:`Consistency` report naming each feature that differs with examples. Integer
features (``sparse``, ``seq_*``, ``ids``) must be equal; floats (``dense``, ``label``, ``weight``)
within ``rel`` (1e-6) relative, NaN equal to NaN. ``flow check consistency`` builds the two
tables from a committed channel (spark_jobs.consistency) and prints the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from flow.errors import ConfigError
from flow.handoff import Channel
from flow.handoff.shards import read_shard
from flow.pipeline.features import (
    Bucketized,
    Cross,
    FeatureSpec,
    Hashed,
    HashedSequence,
    Id,
    Numeric,
    Vocabulary,
    feature_name,
)
from flow.pipeline.state import FeatureState
from flow.transform.apply import FeatureTransform

__all__ = ["Consistency", "Mismatch", "by_key", "committed_sample", "compare"]

REL = 1e-6
"""Floats agree when within this relative difference (or both NaN, or equal)."""


@dataclass(frozen=True)
class Mismatch:
    """One feature whose values differ: how many rows, and a few of them."""

    feature: str
    column: str
    rows: int
    examples: list[dict[str, Any]]
    """Up to ``examples`` rows: the row's key, Spark's value, the Python transform's value."""


@dataclass
class Consistency:
    """What :func:`compare` found."""

    rows: int
    features: int
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def lines(self) -> list[str]:
        """The report for a terminal: a summary line, then each feature that differs."""
        if self.ok:
            return [f"{self.rows:,} rows, {self.features} features: 0 mismatches"]
        out = [
            f"{self.rows:,} rows, {self.features} features: {len(self.mismatches)} feature(s) "
            "differ between Spark and the Python transform"
        ]
        for m in self.mismatches:
            out.append(f"  {m.feature} ({m.column}): {m.rows:,} of {self.rows:,} rows differ")
            out.extend(
                f"    {e['key']}: spark={e['spark']!r} python={e['python']!r}" for e in m.examples
            )
        return out


def _columns(spec: FeatureSpec) -> list[tuple[str, str, int | None]]:
    """(feature, column, position) for every feature value in a training row."""
    dense = [f for f in spec.features if isinstance(f, Numeric)]
    sparse = [f for f in spec.features if isinstance(f, Hashed | Vocabulary | Bucketized | Cross)]
    found: list[tuple[str, str, int | None]] = [
        ("label", "label", None),
        ("weight", "weight", None),
    ]
    found += [(feature_name(f), "dense", i) for i, f in enumerate(dense)]
    found += [(feature_name(f), "sparse", i) for i, f in enumerate(sparse)]
    found += [
        (feature_name(f), f"seq_{feature_name(f)}", None)
        for f in spec.features
        if isinstance(f, HashedSequence)
    ]
    ids = [f for f in spec.features if isinstance(f, Id)]
    found += [(feature_name(f), "ids", i) for i, f in enumerate(ids)]
    return found


def _values(table: pa.Table, column: str, position: int | None) -> np.ndarray:
    array = table.column(column).combine_chunks()
    if pa.types.is_fixed_size_list(array.type) or pa.types.is_list(array.type):
        width = len(array[0]) if len(array) else 0
        flat: np.ndarray = array.flatten().to_numpy(zero_copy_only=False)
        flat = flat.reshape(len(array), width)
        return flat[:, position] if position is not None else flat
    values: np.ndarray = array.to_numpy(zero_copy_only=False)
    return values


def _differ(spark: np.ndarray, python: np.ndarray, rel: float) -> np.ndarray:
    """Per row: whether the values differ (floats within ``rel``; integers exactly)."""
    if spark.shape != python.shape:
        return np.ones(spark.shape[0], dtype=bool)
    if np.issubdtype(spark.dtype, np.floating):
        a, b = spark.astype(np.float64), python.astype(np.float64)
        with np.errstate(invalid="ignore"):
            same = (a == b) | (np.isnan(a) & np.isnan(b)) | (np.abs(a - b) <= rel * np.abs(a))
    else:
        same = spark == python
    differ: np.ndarray = ~same.reshape(same.shape[0], -1).all(axis=1)
    return differ


def compare(
    spec: FeatureSpec,
    spark: pa.Table,
    python: pa.Table,
    keys: list[Any] | None = None,
    *,
    rel: float = REL,
    examples: int = 3,
) -> Consistency:
    """Spark's training rows against the Python transform's, row ``i`` with row ``i``.

    ``keys`` name the rows in the examples (e.g. their impression ids); label and weight are
    compared only where both tables have them."""
    if spark.num_rows != python.num_rows:
        raise ValueError(f"{spark.num_rows} Spark rows against {python.num_rows} Python rows")
    names = keys if keys is not None else list(range(spark.num_rows))
    checked = [
        c for c in _columns(spec) if c[1] in spark.column_names and c[1] in python.column_names
    ]
    report = Consistency(rows=spark.num_rows, features=len(checked))
    for feature, column, position in checked:
        a, b = _values(spark, column, position), _values(python, column, position)
        bad = np.flatnonzero(_differ(a, b, rel))
        if len(bad):
            shown = [
                {"key": names[i], "spark": _plain(a[i]), "python": _plain(b[i])}
                for i in bad[:examples]
            ]
            report.mismatches.append(Mismatch(feature, column, len(bad), shown))
    return report


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray | np.generic) else value


def committed_sample(channel: Channel, batch_id: int, rows: int) -> pa.Table:
    """Up to ``rows`` training rows of commit ``batch_id``, its shards read in order (a shard's
    rows are already permuted, so the first rows are a sample of the bucket)."""
    commit = channel.commit(batch_id)
    tables: list[pa.Table] = []
    taken = 0
    for info in commit.shards:
        if taken >= rows:
            break
        table = read_shard(channel.folder, info, commit=batch_id)
        tables.append(table.slice(0, rows - taken))
        taken += tables[-1].num_rows
    if not tables:
        raise ConfigError(f"commit {batch_id} of channel {channel.name!r} holds no rows to check")
    return pa.concat_tables(tables)


def by_key(
    spec: FeatureSpec, state: FeatureState, committed: pa.Table, raw: pa.Table, key: str
) -> tuple[Consistency, int]:
    """:func:`compare` of ``committed`` training rows with the Python transform of ``raw``
    (the stage's feature inputs), matched on column ``key``; and how many committed rows found
    no raw row, or more than one (a gap the caller must report, never skip silently)."""
    raw_keys = raw.column(key).to_pylist()
    counts: dict[Any, int] = {}
    for k in raw_keys:
        counts[k] = counts.get(k, 0) + 1
    position = {k: i for i, k in enumerate(raw_keys) if counts[k] == 1}
    keys = committed.column(key).to_pylist()
    found = [i for i, k in enumerate(keys) if k in position]
    python = FeatureTransform(spec, state).apply(raw.take([position[keys[i]] for i in found]))
    report = compare(spec, committed.take(found), python, [keys[i] for i in found])
    return report, len(keys) - len(found)
