"""What a model serving on raw events needs of the features that made its training rows.

A pipeline stage records its :class:`ServingFeatures` in the channel it writes (the handoff's
``_features.json``, beside the channel's metadata); a trainer reads it from the channels it
trained on and logs the model as a pyfunc that takes raw columns (``trainers.serving``). So
Spark and PyTorch still meet only at the handoff: the trainer needs neither the pipeline file
nor the feature-state store.

It holds the spec, its fitted state, the Arrow-ready types of the raw columns the features read
(a pandas frame turns an integer column with a null into floats, whose text Spark would hash
otherwise) and a few raw rows of them for the model's input example.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from flow.errors import ConfigError
from flow.pipeline.features import FeatureSpec, spec_from_dict, spec_to_dict
from flow.pipeline.model import Pipeline
from flow.pipeline.state import FeatureState
from flow.transform.apply import FeatureTransform

__all__ = ["ARROW_TYPES", "ServingFeatures"]

ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "array<string>": pa.list_(pa.string()),
    "array<long>": pa.list_(pa.int64()),
}
"""Each Field type as an Arrow type: the raw column the Python transform reads (what Spark's types
map to), and what own data is loaded as (flow.workflows.ingest)."""

EXAMPLE_ROWS = 2
"""Raw rows a stage records for the input example."""


@dataclass(frozen=True)
class ServingFeatures:
    """A stage's features as a served model applies them: spec, state, raw inputs, examples."""

    spec: FeatureSpec
    state: FeatureState
    inputs: dict[str, str]
    """Each raw column the features read (after the label join, enrichments and Derived
    columns), with its Field type, in the transform's order."""
    example: tuple[dict[str, Any], ...] = ()
    """A few raw rows of the inputs (JSON values; timestamps as ISO text); empty where the
    stage recorded none (a live stage sees its rows only inside the streaming plan)."""
    outside_spark: tuple[str, ...] = ()
    """Why the stage's features cannot be applied outside Spark (``Pipeline.outside_spark``);
    empty where they can. A trainer logs a model of feature columns then, and says why."""

    def __post_init__(self) -> None:
        unknown = sorted(t for t in self.inputs.values() if t not in ARROW_TYPES)
        if unknown:
            raise ConfigError(f"raw input type(s) {', '.join(unknown)} have no Arrow type here")

    @classmethod
    def for_stage(
        cls,
        pipeline: Pipeline,
        stage: str,
        state: FeatureState,
        example: pa.Table | None = None,
    ) -> ServingFeatures:
        """``stage``'s features with ``state``; ``example``: raw rows holding at least the
        inputs (the rest of their columns is left out)."""
        spec = pipeline.stage(stage).features
        fields = pipeline.columns[stage]
        inputs: dict[str, str] = {c: fields[c].type for c in FeatureTransform(spec, state).inputs}
        rows: tuple[dict[str, Any], ...] = ()
        if example is not None:
            wanted = example.select(list(inputs)).slice(0, EXAMPLE_ROWS)
            rows = tuple({k: _plain(v) for k, v in r.items()} for r in wanted.to_pylist())
        return cls(spec, state, inputs, rows, tuple(pipeline.outside_spark[stage]))

    @property
    def servable(self) -> bool:
        """Whether the Python transform computes what Spark did (see ``outside_spark``)."""
        return not self.outside_spark

    def schema(self) -> pa.Schema:
        """The raw columns as Arrow fields."""
        return pa.schema([(c, ARROW_TYPES[t]) for c, t in self.inputs.items()])

    def example_table(self) -> pa.Table:
        """The example rows, typed (no rows where none were recorded)."""
        schema = self.schema()
        columns = []
        for f in schema:
            values = [row.get(f.name) for row in self.example]
            if pa.types.is_timestamp(f.type):  # ISO text back to instants
                columns.append(pa.array(values, pa.string()).cast(f.type))
            else:
                columns.append(pa.array(values, f.type))
        return pa.Table.from_arrays(columns, schema=schema)

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": spec_to_dict(self.spec),
            "state": json.loads(self.state.to_json()),
            "inputs": dict(self.inputs),
            "example": list(self.example),
            "outside_spark": list(self.outside_spark),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=list, indent=1)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServingFeatures:
        spec = spec_from_dict(dict(data["spec"]))
        state = FeatureState.from_json(json.dumps(data["state"]))
        state.check(spec)
        return cls(
            spec,
            state,
            dict(data["inputs"]),
            tuple(dict(r) for r in data.get("example", ())),
            tuple(data.get("outside_spark", ())),
        )

    @classmethod
    def from_json(cls, text: str) -> ServingFeatures:
        return cls.from_dict(json.loads(text))


def _plain(value: Any) -> Any:
    """A raw value as JSON holds it: an instant as ISO text (UTC), the rest as it is."""
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return aware.astimezone(dt.UTC).isoformat()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
