"""Per-feature statistics of the training rows in a handoff channel.

Read straight from the shards (pyarrow, no Spark, no torch): the commits profiled are held in
memory together, so profile a run's commits (or a sample of them), not years of history. The
feature layout the channel records names each value of
the ``dense`` and ``sparse`` blocks; index 0 of a categorical feature is its null / out-of-
vocabulary bucket, so its share is the feature's OOV rate.

Numbers are profiled in their raw column's units where the channel records how its transform
maps them (ChannelMeta.units): a person reads an age of 41 years, not -0.01 standard
deviations, and the bins stay put when a refit moves the standardizing moments.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from flow.errors import ConfigError
from flow.handoff.channel import Channel
from flow.handoff.shards import read_shard

__all__ = ["CategoricalStats", "NumericStats", "Profile", "profile_channel", "to_raw"]

QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
BINS = 10
TOP = 20


@dataclass
class NumericStats:
    count: int
    nulls: int
    mean: float
    std: float
    quantiles: dict[str, float]
    edges: list[float]
    """Decile edges: the bins drift is measured in, against the next run."""
    counts: list[int]
    """Rows per bin of ``edges`` (with the open ends below the first and above the last)."""
    raw: bool = False
    """In the raw column's units (the channel records its transform), or as stored (older
    channels, and channels written outside a pipeline stage: standardized values)."""


@dataclass
class CategoricalStats:
    count: int
    oov: int
    """Rows at index 0: null, out of vocabulary or hashed to the null bucket."""
    distinct: int
    top: dict[str, int]
    """The most frequent indices and their rows, and those of the reference profile's."""

    @property
    def oov_rate(self) -> float:
        return self.oov / self.count if self.count else 0.0


@dataclass
class Profile:
    channel: str
    commits: list[int]
    rows: int
    positives: float
    numeric: dict[str, NumericStats] = field(default_factory=dict)
    categorical: dict[str, CategoricalStats] = field(default_factory=dict)
    label_rate_by_hour: dict[str, list[float]] = field(default_factory=dict)
    """Hour (ISO) -> [rows, label rate], when the rows carry an event time."""

    @property
    def label_rate(self) -> float:
        return self.positives / self.rows if self.rows else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        return cls(
            channel=data["channel"],
            commits=list(data["commits"]),
            rows=int(data["rows"]),
            positives=float(data["positives"]),
            numeric={k: NumericStats(**v) for k, v in data["numeric"].items()},
            categorical={k: CategoricalStats(**v) for k, v in data["categorical"].items()},
            label_rate_by_hour={k: list(v) for k, v in data["label_rate_by_hour"].items()},
        )


def _block(table: pa.Table, name: str, width: int) -> np.ndarray:
    column = table.column(name).combine_chunks()
    return np.asarray(column.flatten().to_numpy(zero_copy_only=False)).reshape(-1, width)


def to_raw(values: np.ndarray, units: dict[str, Any]) -> np.ndarray:
    """Stored dense values back in their raw column's units (flow.pipeline.state.raw_units):
    the standardizing undone, then the log1p."""
    x = values * float(units.get("std", 1.0)) + float(units.get("mean", 0.0))
    return np.expm1(x) if units.get("log") else x


def _numeric(values: np.ndarray, edges: list[float] | None, raw: bool) -> NumericStats:
    present = values[~np.isnan(values)]
    if edges is None:
        edges = (
            np.unique(np.quantile(present, np.linspace(0.1, 0.9, BINS - 1))).tolist()
            if present.size
            else []
        )
    counts = np.bincount(np.searchsorted(edges, present, side="right"), minlength=len(edges) + 1)
    quantiles = np.quantile(present, QUANTILES) if present.size else np.full(len(QUANTILES), np.nan)
    return NumericStats(
        count=int(values.size),
        nulls=int(values.size - present.size),
        mean=float(present.mean()) if present.size else float("nan"),
        std=float(present.std()) if present.size else float("nan"),
        quantiles={
            f"p{round(q * 100)}": float(v) for q, v in zip(QUANTILES, quantiles, strict=True)
        },
        edges=[float(e) for e in edges],
        counts=[int(c) for c in counts],
        raw=raw,
    )


def profile_channel(
    channel: Channel,
    commits: list[int] | None = None,
    *,
    event_time: str | None = None,
    reference: Profile | None = None,
) -> Profile:
    """Statistics of ``commits`` of ``channel`` (default: all kept ones).

    ``event_time`` (default: the rows' first timestamp column) gives the label rate over time.
    With a ``reference`` (the previous run's profile) the numeric bins are its bins and its
    most frequent categories are counted too, so the two compare bin for bin (drift).
    """
    meta = channel.meta()
    if not meta.layout:
        raise ConfigError(
            f"channel {channel.name!r} records no feature layout, so its values have no names; "
            "profile channels written by pipeline stages"
        )
    dense = list(meta.layout.get("dense", []))
    sparse = [name for name, _ in meta.layout.get("sparse", [])]
    ids = [b for b in (commits or channel.commit_ids()) if not channel.retired(b)]
    tables = [
        read_shard(channel.folder, shard, commit=b)
        for b in ids
        for shard in channel.commit(b).shards
    ]
    if not tables:
        return Profile(channel.name, ids, 0, 0.0)
    table = pa.concat_tables(tables)
    labels = table.column("label").to_numpy().astype(np.float64)
    found = Profile(channel.name, ids, table.num_rows, float(labels.sum()))
    if dense:
        block = _block(table, "dense", len(dense)).astype(np.float64)
        units = meta.units or {}
        for j, name in enumerate(dense):
            raw = name in units
            values = to_raw(block[:, j], units[name]) if raw else block[:, j]
            previous = reference.numeric.get(name) if reference else None
            # Bins in other units than these (a reference from before channels recorded their
            # units) would compare nothing: this profile makes its own.
            edges = previous.edges if previous is not None and previous.raw == raw else None
            found.numeric[name] = _numeric(values, edges, raw)
    if sparse:
        block = _block(table, "sparse", len(sparse))
        for j, name in enumerate(sparse):
            counts = Counter(block[:, j].tolist())
            top = {str(k): int(v) for k, v in counts.most_common(TOP)}
            earlier = reference.categorical.get(name) if reference else None
            for key in earlier.top if earlier else ():
                top.setdefault(key, int(counts.get(int(key), 0)))
            found.categorical[name] = CategoricalStats(
                count=int(block.shape[0]),
                oov=int(counts.get(0, 0)),
                distinct=len(counts),
                top=top,
            )
    if event_time is None:
        stamps = [f.name for f in table.schema if pa.types.is_timestamp(f.type)]
        event_time = stamps[0] if stamps else None
    if event_time is not None and event_time in table.column_names:
        hours = table.column(event_time).cast(pa.timestamp("us", tz="UTC")).to_numpy()
        bucket = hours.astype("datetime64[h]")
        for hour in np.unique(bucket):
            mask = bucket == hour
            found.label_rate_by_hour[str(hour)] = [int(mask.sum()), float(labels[mask].mean())]
    return found
