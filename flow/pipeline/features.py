"""The feature spec: what each training row holds, declared once for batch, stream and trainer.

Every categorical feature maps to an index in ``[0, cardinality)`` with 0 reserved for null,
out-of-vocabulary and padding, so the trainer can size embedding tables from the spec alone. An
:class:`Id` is the exception: its raw 64-bit ids travel unchanged (the ``ids`` block) to a table
the trainer grows and prunes as ids come and go (``trainers.dynamic``).
Numeric features become one float each in the dense block. Stateful transforms (vocabularies,
means and deviations, quantile boundaries) are fitted on a batch stage and saved as a versioned
:class:`~flow.pipeline.state.FeatureState`; the streaming stage and the trainer reuse it unchanged.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Literal, get_args

from flow.errors import ConfigError
from flow.pipeline.schema import Definition, check_identifier

__all__ = [
    "Bucketized",
    "Cross",
    "Feature",
    "FeatureSpec",
    "Hashed",
    "HashedSequence",
    "Id",
    "Numeric",
    "Vocabulary",
    "spec_from_dict",
    "spec_to_dict",
]

Kind = Literal["dense", "sparse", "sequence", "id"]
LabelKind = Literal["binary", "probability"]
"""What a FeatureSpec's labels may be (see ``FeatureSpec.labels``)."""
MAX_VOCABULARY = 100_000
NULL_ID = -(2**63)
"""What an :class:`Id` feature's null becomes in the ``ids`` block (the trainer maps it to row 0).
The other end of int64, ``2**63 - 1``, is reserved too: a dynamic table marks free rows with it."""


def _buckets(buckets: int, owner: str) -> None:
    if not 2 <= buckets <= 2**31 - 1:
        raise ConfigError(f"{owner}: buckets={buckets} must be in 2..2^31-1")


@dataclass(frozen=True)
class Hashed(Definition):
    """A categorical column hashed into ``buckets`` indices (index 0: null)."""

    column: str
    buckets: int
    name: str | None = None

    def __post_init__(self) -> None:
        _buckets(self.buckets, f"Hashed({self.column!r})")

    kind: ClassVar[Kind] = "sparse"
    fitted: ClassVar[bool] = False


@dataclass(frozen=True)
class Id(Definition):
    """A raw 64-bit id (an integer column) passed through unchanged, for a table the trainer
    sizes: ``dynamic`` (a row per admitted id, no collisions) or ``hashed`` there (see
    ``flow.training.EmbeddingConfig``). Null becomes :data:`NULL_ID`; the trainer maps it, and
    ``2**63 - 1``, to its shared row 0."""

    column: str
    name: str | None = None

    kind: ClassVar[Kind] = "id"
    fitted: ClassVar[bool] = False


@dataclass(frozen=True)
class Vocabulary(Definition):
    """A categorical column looked up in a vocabulary fitted on the batch stage.

    Values seen at least ``min_frequency`` times, most frequent first, up to ``max_size``, get
    indices 1..n; everything else (and null) is the out-of-vocabulary index 0.
    """

    column: str
    min_frequency: int = 1
    max_size: int = 10_000
    name: str | None = None

    def __post_init__(self) -> None:
        owner = f"Vocabulary({self.column!r})"
        if self.min_frequency < 1:
            raise ConfigError(f"{owner}: min_frequency={self.min_frequency} must be at least 1")
        if not 1 <= self.max_size <= MAX_VOCABULARY:
            raise ConfigError(
                f"{owner}: max_size={self.max_size} must be in 1..{MAX_VOCABULARY}; use Hashed "
                "for high-cardinality columns such as ids"
            )

    kind: ClassVar[Kind] = "sparse"
    fitted: ClassVar[bool] = True


@dataclass(frozen=True)
class Numeric(Definition):
    """A number for the dense block: clipped, then log1p, then null-filled and standardized.

    ``fill`` replaces nulls; left None, nulls become the fitted mean (0 after standardizing).
    """

    column: str
    clip: tuple[float, float] | None = None
    log: bool = False
    standardize: bool = True
    fill: float | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.clip is not None and self.clip[0] >= self.clip[1]:
            raise ConfigError(f"Numeric({self.column!r}): clip={self.clip} needs low < high")

    kind: ClassVar[Kind] = "dense"

    @property
    def fitted(self) -> bool:
        return self.standardize or self.fill is None


@dataclass(frozen=True)
class Bucketized(Definition):
    """A number cut at quantiles fitted on the batch stage: index 1..buckets, 0 for null."""

    column: str
    buckets: int
    clip: tuple[float, float] | None = None
    log: bool = False
    name: str | None = None

    def __post_init__(self) -> None:
        if not 2 <= self.buckets <= 1000:
            raise ConfigError(f"Bucketized({self.column!r}): buckets={self.buckets} not in 2..1000")
        if self.clip is not None and self.clip[0] >= self.clip[1]:
            raise ConfigError(f"Bucketized({self.column!r}): clip={self.clip} needs low < high")

    kind: ClassVar[Kind] = "sparse"
    fitted: ClassVar[bool] = True


@dataclass(frozen=True)
class Cross(Definition):
    """Two or more categorical columns crossed and hashed into ``buckets`` indices."""

    columns: tuple[str, ...]
    buckets: int
    name: str | None = None

    def __post_init__(self) -> None:
        if len(self.columns) < 2:
            raise ConfigError(f"Cross{self.columns}: cross at least two columns")
        _buckets(self.buckets, f"Cross{self.columns}")

    kind: ClassVar[Kind] = "sparse"
    fitted: ClassVar[bool] = False


@dataclass(frozen=True)
class HashedSequence(Definition):
    """A multi-valued column: up to ``max_length`` values hashed into ``buckets``, 0-padded."""

    column: str
    max_length: int
    buckets: int
    name: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.max_length <= 4096:
            raise ConfigError(
                f"HashedSequence({self.column!r}): max_length={self.max_length} not in 1..4096"
            )
        _buckets(self.buckets, f"HashedSequence({self.column!r})")

    kind: ClassVar[Kind] = "sequence"
    fitted: ClassVar[bool] = False


Feature = Hashed | Vocabulary | Numeric | Bucketized | Cross | HashedSequence | Id

# HashedSequence was called Sequence (which shadowed collections.abc.Sequence); fingerprints keep
# the old name so that feature states fitted before the rename still belong to their spec.
_FINGERPRINT_KIND: dict[type, str] = {HashedSequence: "Sequence"}


def feature_name(feature: Feature) -> str:
    if feature.name:
        return feature.name
    if isinstance(feature, Cross):
        return "_x_".join(feature.columns)
    return feature.column


def feature_inputs(feature: Feature) -> tuple[str, ...]:
    return feature.columns if isinstance(feature, Cross) else (feature.column,)


@dataclass(frozen=True)
class FeatureSpec(Definition):
    """The features of a training row, its label and its weight."""

    name: str
    """Names the fitted state; the batch and the streaming stage of a pipeline share it."""
    features: tuple[Feature, ...]
    label: str = "label"
    """The column holding the label (0/1 for CTR; the label join writes ``label``)."""
    weight: str | float = 1.0
    """A numeric column, or one weight for every row."""
    passthrough: tuple[str, ...] = ()
    """Columns copied unchanged into training rows (event time, ids for debugging)."""
    labels: LabelKind = "binary"
    """What a label may be: ``binary``, 0 or 1 (a click); ``probability``, any value in [0, 1]
    (a soft label). A row with another label is a dead letter naming it, never a training row."""
    weight_range: tuple[float, float] | None = None
    """For a weight column: the values a weight may take, inclusive (e.g. ``(0.1, 100)``);
    rows outside it are dead letters. Any weight must be positive."""

    def __post_init__(self) -> None:
        check_identifier(self.name, "FeatureSpec.name")
        if not self.features:
            raise ConfigError(f"FeatureSpec {self.name!r} has no features")
        names = [feature_name(f) for f in self.features]
        for name in names:
            check_identifier(name, "feature name")
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(
                f"FeatureSpec {self.name!r}: feature name(s) {', '.join(duplicates)} used twice; "
                "give one of them name=..."
            )
        if isinstance(self.weight, float | int) and self.weight <= 0:
            raise ConfigError(f"FeatureSpec {self.name!r}: weight={self.weight} must be positive")
        self._check_label_and_weight()
        reserved = {"label", "weight", "dense", "sparse", "ids"} | {f"seq_{n}" for n in names}
        clash = sorted(set(self.passthrough) & reserved - {self.label})
        if clash:
            raise ConfigError(
                f"FeatureSpec {self.name!r}: passthrough column(s) {', '.join(clash)} clash with "
                "the training row's own columns"
            )

    def _check_label_and_weight(self) -> None:
        if self.labels not in get_args(LabelKind):
            raise ConfigError(
                f"FeatureSpec {self.name!r}: labels={self.labels!r}; use 'binary' (0 or 1) or "
                "'probability' (0 to 1)"
            )
        if self.weight_range is None:
            return
        if not isinstance(self.weight, str):
            raise ConfigError(
                f"FeatureSpec {self.name!r}: weight_range is for a weight column; "
                f"weight={self.weight} is one weight for every row"
            )
        low, high = self.weight_range
        if not (math.isfinite(low) and math.isfinite(high) and 0 < low <= high):
            raise ConfigError(
                f"FeatureSpec {self.name!r}: weight_range={self.weight_range}; give "
                "(low, high) with 0 < low <= high"
            )

    def names(self) -> list[str]:
        return [feature_name(f) for f in self.features]

    def of_kind(self, kind: Kind) -> list[Feature]:
        return [f for f in self.features if f.kind == kind]

    def inputs(self) -> list[str]:
        """Every column the spec reads, in first-use order."""
        columns: list[str] = []
        for feature in self.features:
            columns.extend(feature_inputs(feature))
        columns.append(self.label)
        if isinstance(self.weight, str):
            columns.append(self.weight)
        columns.extend(self.passthrough)
        return list(dict.fromkeys(columns))

    @property
    def needs_fit(self) -> bool:
        return any(f.fitted for f in self.features)

    @property
    def fingerprint(self) -> str:
        """Changes whenever anything in the spec does; a fitted state belongs to one."""
        canonical = json.dumps(
            {
                "name": self.name,
                "features": [
                    [_FINGERPRINT_KIND.get(type(f), type(f).__name__), asdict(f)]
                    for f in self.features
                ],
                "label": self.label,
                "weight": self.weight,
                "passthrough": list(self.passthrough),
                # Only when set: states fitted before these settings existed still fit.
                **({"labels": self.labels} if self.labels != "binary" else {}),
                **({"weight_range": self.weight_range} if self.weight_range else {}),
            },
            sort_keys=True,
            default=list,
        )
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


_KINDS: dict[str, type] = {
    k.__name__: k for k in (Hashed, Vocabulary, Numeric, Bucketized, Cross, HashedSequence)
}


def _tuples(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def spec_to_dict(spec: FeatureSpec) -> dict[str, Any]:
    """``spec`` as plain data (JSON), e.g. to travel with a served model: see
    :func:`spec_from_dict`."""
    plain = asdict(spec)
    plain["features"] = [{"kind": type(f).__name__, **asdict(f)} for f in spec.features]
    return plain


def spec_from_dict(data: dict[str, Any]) -> FeatureSpec:
    """The spec :func:`spec_to_dict` wrote, validated again (same fingerprint)."""
    features = []
    for entry in data["features"]:
        fields = dict(entry)
        kind = _KINDS.get(fields.pop("kind"))
        if kind is None:
            raise ConfigError(
                f"feature kind {entry['kind']!r} is unknown; kinds: {', '.join(_KINDS)}"
            )
        features.append(kind(**{k: _tuples(v) for k, v in fields.items()}))
    rest = {k: _tuples(v) for k, v in data.items() if k != "features"}
    return FeatureSpec(features=tuple(features), **rest)
