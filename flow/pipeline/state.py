"""Fitted feature state: vocabularies, moments and quantile boundaries, saved by version.

The batch stage fits it; the streaming stage and the trainer load it and use it unchanged. A
state belongs to exactly one :class:`FeatureSpec` (by fingerprint): a changed spec needs a new fit,
and loading says so instead of silently mixing old vocabularies with new features. Its version is
a hash of its content, so the same fit saved twice is one version.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from flow.config import StackConfig
from flow.errors import ConfigError
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
from flow.pipeline.schema import did_you_mean
from flow.storage import Location, namespace_locations

__all__ = ["FeatureState", "Layout", "layout", "raw_units", "states_location"]

_LATEST = "LATEST"


def states_location(stack: StackConfig, namespace: str) -> Location:
    """Where the fitted states of a pipeline namespace live (one folder per spec inside)."""
    return namespace_locations(stack, namespace).feature_state


@dataclass(frozen=True)
class FeatureState:
    """What fitting a spec learned from the data."""

    spec_name: str
    spec_fingerprint: str
    vocabularies: dict[str, list[str]] = field(default_factory=dict)
    """Feature name -> values in index order (index = position + 1; 0 is out-of-vocabulary)."""
    moments: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Feature name -> (mean, standard deviation) of the transformed value."""
    boundaries: dict[str, list[float]] = field(default_factory=dict)
    """Feature name -> ascending cut points; index = 1 + number of cut points <= value."""
    fitted_on: dict[str, Any] = field(default_factory=dict)
    """Lineage: source snapshots, row count, time. Not part of the version."""

    def _content(self) -> dict[str, Any]:
        return {
            "spec_name": self.spec_name,
            "spec_fingerprint": self.spec_fingerprint,
            "vocabularies": self.vocabularies,
            "moments": {k: list(v) for k, v in self.moments.items()},
            "boundaries": self.boundaries,
        }

    @property
    def version(self) -> str:
        canonical = json.dumps(self._content(), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]

    def to_json(self) -> str:
        return json.dumps(
            {**self._content(), "version": self.version, "fitted_on": self.fitted_on},
            indent=1,
            sort_keys=True,
            default=str,
        )

    @classmethod
    def from_json(cls, text: str) -> FeatureState:
        data = json.loads(text)
        state = cls(
            spec_name=data["spec_name"],
            spec_fingerprint=data["spec_fingerprint"],
            vocabularies={k: list(v) for k, v in data["vocabularies"].items()},
            moments={k: (float(v[0]), float(v[1])) for k, v in data["moments"].items()},
            boundaries={k: [float(b) for b in v] for k, v in data["boundaries"].items()},
            fitted_on=data.get("fitted_on", {}),
        )
        if data.get("version") not in (None, state.version):
            raise ConfigError(
                f"feature state {data.get('version')} is corrupt: its content hashes to "
                f"{state.version}; fit it again"
            )
        return state

    def check(self, spec: FeatureSpec) -> None:
        """Raise unless this state was fitted for ``spec`` and covers every fitted feature."""
        if self.spec_fingerprint != spec.fingerprint:
            raise ConfigError(
                f"feature state {self.version} was fitted for another version of spec "
                f"{spec.name!r} ({self.spec_fingerprint}, now {spec.fingerprint}); run the batch "
                "stage again to fit the changed spec"
            )
        for feature in spec.features:
            name = feature_name(feature)
            missing = (
                (isinstance(feature, Vocabulary) and name not in self.vocabularies)
                or (isinstance(feature, Bucketized) and name not in self.boundaries)
                or (isinstance(feature, Numeric) and feature.fitted and name not in self.moments)
            )
            if missing:
                raise ConfigError(f"feature state {self.version} has nothing fitted for {name!r}")

    # -- storage -------------------------------------------------------------------------------

    def save(self, root: Location) -> str:
        """Write under ``root/<spec name>/<version>.json``; LATEST stays where it is (see
        :meth:`make_latest`). Loading by version finds it from now on."""
        folder = root.child(self.spec_name)
        folder.write_bytes(f"{self.version}.json", self.to_json().encode())
        return f"{folder}/{self.version}.json"

    def make_latest(self, root: Location) -> None:
        """Point the spec's LATEST at this (saved) state: what loading without a version gets.

        The stage that fitted it calls this once its outputs are committed, so a stage that
        fails after fitting leaves LATEST on the last state a stage succeeded with.
        """
        folder = root.child(self.spec_name)
        if not folder.exists(f"{self.version}.json"):
            raise ConfigError(
                f"feature state {self.version} is not saved in {folder}; save it before making "
                "it the latest"
            )
        folder.write_bytes(_LATEST, self.version.encode())

    @classmethod
    def load(cls, root: Location, spec: FeatureSpec, version: str | None = None) -> FeatureState:
        """The state ``version`` of ``spec`` (default: the latest), checked against the spec."""
        folder = root.child(spec.name)
        if version is None:
            if not folder.exists(_LATEST):
                raise ConfigError(
                    f"no fitted feature state for spec {spec.name!r} in {folder}; run the "
                    "pipeline's batch stage (the one with fit=True) first"
                )
            version = folder.read_bytes(_LATEST).decode().strip()
        if not folder.exists(f"{version}.json"):
            have = [n.removesuffix(".json") for n in folder.list(".json")]
            raise ConfigError(
                f"feature state {version} of spec {spec.name!r} is not in {folder}; "
                f"versions there: {', '.join(have) or 'none'}{did_you_mean(version, have)}"
            )
        state = cls.from_json(folder.read_bytes(f"{version}.json").decode())
        state.check(spec)
        return state


@dataclass(frozen=True)
class Layout:
    """Where each feature sits in a training row: the contract between Spark and the trainer."""

    dense: tuple[str, ...]
    """Names of the floats in the ``dense`` column, in order."""
    sparse: tuple[tuple[str, int], ...]
    """(name, cardinality) of the indices in the ``sparse`` column, in order."""
    sequences: tuple[tuple[str, int, int], ...]
    """(name, cardinality, length) of each ``seq_<name>`` column."""
    ids: tuple[str, ...] = ()
    """Names of the raw 64-bit ids in the ``ids`` column (``Id`` features), in order."""

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "dense": list(self.dense),
            "sparse": [list(s) for s in self.sparse],
            "sequences": [list(s) for s in self.sequences],
        }
        # Only when present: layouts recorded before Id features existed compare equal.
        if self.ids:
            data["ids"] = list(self.ids)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Layout:
        return cls(
            dense=tuple(data["dense"]),
            sparse=tuple((str(n), int(c)) for n, c in data["sparse"]),
            sequences=tuple((str(n), int(c), int(k)) for n, c, k in data["sequences"]),
            ids=tuple(str(n) for n in data.get("ids", ())),
        )


def cardinality(feature: Hashed | Vocabulary | Bucketized | Cross, state: FeatureState) -> int:
    name = feature_name(feature)
    if isinstance(feature, Vocabulary):
        return len(state.vocabularies[name]) + 1
    if isinstance(feature, Bucketized):
        return len(state.boundaries[name]) + 2  # 0 null, 1..len+1 between the cut points
    return feature.buckets


def layout(spec: FeatureSpec, state: FeatureState | None) -> Layout:
    """The row layout of ``spec``; fitted features need ``state``."""
    if spec.needs_fit:
        if state is None:
            raise ConfigError(f"spec {spec.name!r} has fitted features; a FeatureState is needed")
        state.check(spec)
    empty = FeatureState(spec.name, spec.fingerprint)
    fitted = state or empty
    dense = tuple(feature_name(f) for f in spec.features if isinstance(f, Numeric))
    sparse = tuple(
        (feature_name(f), cardinality(f, fitted))
        for f in spec.features
        if isinstance(f, Hashed | Vocabulary | Bucketized | Cross)
    )
    sequences = tuple(
        (feature_name(f), f.buckets, f.max_length)
        for f in spec.features
        if isinstance(f, HashedSequence)
    )
    ids = tuple(feature_name(f) for f in spec.features if isinstance(f, Id))
    return Layout(dense, sparse, sequences, ids)


def raw_units(spec: FeatureSpec, state: FeatureState | None) -> dict[str, dict[str, Any]]:
    """Per dense feature of ``spec``, what turns its stored value back into its raw column's
    units: ``value * std + mean`` undoes the standardizing, then ``expm1`` the ``log``. A
    channel records it (ChannelMeta.units) so that ``flow insight`` reports ages in years and
    prices in money, not in standard deviations. Two things stay as the transform left them:
    values clipped at ``clip`` sit at its bounds, and nulls are their fill value."""
    fitted = state or FeatureState(spec.name, spec.fingerprint)
    units: dict[str, dict[str, Any]] = {}
    for feature in spec.features:
        if not isinstance(feature, Numeric):
            continue
        name = feature_name(feature)
        mean, std = fitted.moments.get(name, (0.0, 1.0)) if feature.standardize else (0.0, 1.0)
        units[name] = {
            "column": feature.column,
            "mean": mean,
            # As the transform divides (flow.transform.apply): a constant column by 1.
            "std": std if std > 0 else 1.0,
            "log": feature.log,
            "clip": list(feature.clip) if feature.clip is not None else None,
        }
    return units
