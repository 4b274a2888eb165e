"""What ``flow tune`` searches: the trainer settings a study varies, and over which values.

A search space maps trainer settings, named as in a ``--config`` file (``optim.lr``,
``batch_size``, ``model.embedding_dim``), to a range or to choices. On the command line each is
``--param NAME=SPEC``:

    optim.lr=1e-4:1e-2:log          a range, sampled log-uniformly (``low:high`` uniformly)
    model.embedding_dim=8,16,32     choices
    model.name=dlrm                 one value: the setting is fixed for every trial

A ``--space FILE`` (JSON) holds the same, a spec string, a list of choices or
``{"low": ..., "high": ..., "log": true}`` per setting; it replaces :data:`DEFAULT_SPACE`, and
each ``--param`` then sets one entry over it. Everything is checked before the first trial
trains: an unknown setting is named with the closest one, and each bound and choice is applied
to the trainer's configuration, whose checks name what to change.

Torch- and Optuna-free, like :mod:`flow.training`: the space is data, validated when built;
``trainers.tune`` samples it.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from flow.errors import ConfigError
from flow.training import ModelConfig, OptimConfig, TrainConfig

__all__ = [
    "DEFAULT_SPACE",
    "SEARCHABLE",
    "Choices",
    "Param",
    "Range",
    "Scalar",
    "SearchSpace",
    "TuneConfig",
    "apply",
    "build_space",
    "parse_param",
]

Scalar = int | float | str | bool

TRAIN_SETTINGS = ("batch_size", "window_batches", "epochs", "max_steps", "early_stop")
"""The run-level settings a study may vary; the others say which rows a trial reads, where it
runs or where its results go, and must be the same for every trial to compare them."""


def _kind(hint: Any) -> type | tuple[str, ...] | None:
    """The scalar type a field holds (its Literal's names for a choice), or None (a tuple,
    a dict, a nested config: not searchable). ``X | None`` searches X."""
    if typing.get_origin(hint) is Annotated:
        hint = get_args(hint)[0]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        rest = [a for a in get_args(hint) if a is not type(None)]
        return _kind(rest[0]) if len(rest) == 1 else None
    if typing.get_origin(hint) is Literal:
        return tuple(str(a) for a in get_args(hint))
    return hint if hint in (bool, int, float, str) else None


def _searchable() -> dict[str, type | tuple[str, ...]]:
    found: dict[str, type | tuple[str, ...]] = {}
    for prefix, kind, names in (
        ("", TrainConfig, TRAIN_SETTINGS),
        ("model.", ModelConfig, None),
        ("optim.", OptimConfig, None),
    ):
        hints = typing.get_type_hints(kind, include_extras=True)
        for f in dataclasses.fields(kind):
            scalar = _kind(hints[f.name])
            if scalar is not None and (names is None or f.name in names):
                found[prefix + f.name] = scalar
    return found


SEARCHABLE: Mapping[str, type | tuple[str, ...]] = _searchable()
"""Each setting a space may name, and what it holds: a type, or a Literal's names."""


def _check_name(name: str) -> str:
    name = name.strip().removeprefix("--").replace("-", "_")
    if name in SEARCHABLE:
        return name
    close = difflib.get_close_matches(name, list(SEARCHABLE), n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"searchable: {', '.join(SEARCHABLE)}"
    raise ConfigError(f"--param {name}: not a trainer setting flow tune can search; {hint}")


def _value(name: str, text: Any) -> Scalar:
    """``text`` (a word of a spec, or a JSON value) as the setting's type."""
    kind = SEARCHABLE[name]
    if isinstance(kind, tuple):
        if str(text) not in kind:
            raise ConfigError(f"--param {name}: {text!r} is not one of {', '.join(kind)}")
        return str(text)
    if kind is bool:
        if isinstance(text, bool) or str(text).lower() in ("true", "false"):
            return text if isinstance(text, bool) else str(text).lower() == "true"
        raise ConfigError(f"--param {name}: {text!r} is not true or false")
    if kind is str:
        return str(text)
    try:
        number = float(text)
    except (TypeError, ValueError):
        raise ConfigError(f"--param {name}: {text!r} is not a number") from None
    if kind is int:
        if not number.is_integer():
            raise ConfigError(f"--param {name}: {text!r} is not a whole number")
        return int(number)
    return number


@dataclass(frozen=True)
class Range:
    """Numbers from ``low`` to ``high`` (both included), whole numbers for an int setting."""

    name: str
    low: float
    high: float
    log: bool = False
    """Sample the logarithm uniformly: for rates and penalties spanning decades."""

    def __post_init__(self) -> None:
        kind = SEARCHABLE.get(self.name)
        if kind not in (int, float):
            raise ConfigError(
                f"--param {self.name}: a range needs a numeric setting; give choices: a,b,c"
            )
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low < self.high):
            raise ConfigError(
                f"--param {self.name}: the range {self.low}:{self.high} is empty; give low < high"
            )
        if self.log and self.low <= 0:
            raise ConfigError(
                f"--param {self.name}: a log range starts above 0, not at {self.low}; "
                "give a positive low or drop ':log'"
            )

    @property
    def integer(self) -> bool:
        return SEARCHABLE[self.name] is int

    @property
    def values(self) -> tuple[Scalar, ...]:
        """The bounds: what is checked against the trainer's configuration."""
        if self.integer:
            return (int(self.low), int(self.high))
        return (self.low, self.high)

    def spec(self) -> str:
        low, high = self.values
        return f"{low}:{high}" + (":log" if self.log else "")


@dataclass(frozen=True)
class Choices:
    """One of ``values``; a single value fixes the setting for every trial."""

    name: str
    values: tuple[Scalar, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", tuple(self.values))
        if not self.values:
            raise ConfigError(f"--param {self.name}: no values; give one or more: a,b,c")
        if len(set(self.values)) != len(self.values):
            raise ConfigError(f"--param {self.name}: {list(self.values)} repeats a value")

    def spec(self) -> str:
        return ",".join(str(v) for v in self.values)


Param = Range | Choices


def parse_spec(name: str, spec: Any) -> Param:
    """One setting's entry: a spec string (``low:high[:log]`` or ``a,b,c``), a list of choices,
    or ``{"low": ..., "high": ..., "log": bool}``."""
    name = _check_name(name)
    if isinstance(spec, list):
        return Choices(name, tuple(_value(name, v) for v in spec))
    if isinstance(spec, dict):
        unknown = sorted(set(spec) - {"low", "high", "log"})
        if unknown or not {"low", "high"} <= set(spec):
            raise ConfigError(
                f"--param {name}: a range is {{'low': ..., 'high': ..., 'log': true}}, not {spec}"
            )
        low, high = _value(name, spec["low"]), _value(name, spec["high"])
        return Range(name, float(low), float(high), bool(spec.get("log", False)))
    if isinstance(spec, bool | int | float):
        return Choices(name, (_value(name, spec),))
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"--param {name}: give low:high, low:high:log or a,b,c")
    parts = spec.strip().split(":")
    if len(parts) == 1:
        return Choices(name, tuple(_value(name, v.strip()) for v in parts[0].split(",")))
    if len(parts) > 3 or (len(parts) == 3 and parts[2] != "log"):
        raise ConfigError(f"--param {name}={spec}: give low:high or low:high:log")
    if isinstance(SEARCHABLE[name], tuple) or SEARCHABLE[name] in (bool, str):
        raise ConfigError(f"--param {name}={spec}: {name} takes names; give choices: a,b,c")
    low, high = (_value(name, p.strip()) for p in parts[:2])
    return Range(name, float(low), float(high), log=len(parts) == 3)


def parse_param(text: str) -> Param:
    """``NAME=SPEC`` of a ``--param``."""
    name, sep, spec = text.partition("=")
    if not sep:
        raise ConfigError(f"--param {text}: give NAME=SPEC, e.g. --param optim.lr=1e-4:1e-2:log")
    return parse_spec(name, spec)


@dataclass(frozen=True)
class SearchSpace:
    """The settings a study varies, in order (each trial samples them in this order)."""

    params: tuple[Param, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(self.params))
        names = [p.name for p in self.params]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"the search space names {', '.join(twice)} twice; keep one")

    def overridden(self, params: Iterable[Param]) -> SearchSpace:
        """This space with ``params`` in place of the entries of their names (new ones last)."""
        given = {p.name: p for p in params}
        kept = [given.pop(p.name, p) for p in self.params]
        return SearchSpace((*kept, *given.values()))

    def check(self, base: TrainConfig) -> None:
        """Every bound and choice applied alone to ``base``: a value the trainer refuses fails
        here, before any trial, with the trainer's reason."""
        for param in self.params:
            for value in param.values:
                try:
                    apply(base, {param.name: value})
                except ConfigError as exc:
                    raise ConfigError(f"--param {param.name}={value}: {exc}") from exc

    def to_dict(self) -> dict[str, str]:
        """Each setting's spec string (what ``--param`` takes), for records."""
        return {p.name: p.spec() for p in self.params}


def load_space(path: Path) -> SearchSpace:
    """A ``--space`` file: a JSON object of setting -> spec."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--space {path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--space {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or not data:
        raise ConfigError(
            f'--space {path}: give a JSON object, e.g. {{"optim.lr": "1e-4:1e-2:log"}}'
        )
    return SearchSpace(tuple(parse_spec(name, spec) for name, spec in data.items()))


def build_space(space_file: Path | None, params: Sequence[str]) -> SearchSpace:
    """The file's space (or the default), then each ``--param NAME=SPEC`` over it."""
    space = load_space(space_file) if space_file is not None else DEFAULT_SPACE
    return space.overridden(parse_param(p) for p in params)


def apply(base: TrainConfig, values: Mapping[str, Scalar]) -> TrainConfig:
    """``base`` with the settings ``values`` names (``optim.lr``, ``batch_size``), checked."""
    nested: dict[str, dict[str, Scalar]] = {"model": {}, "optim": {}, "": {}}
    for name, value in values.items():
        group, _, field = name.rpartition(".")
        nested[group][field] = value
    return replace(
        base,
        model=replace(base.model, **nested["model"]),  # type: ignore[arg-type]
        optim=replace(base.optim, **nested["optim"]),  # type: ignore[arg-type]
        **nested[""],  # type: ignore[arg-type]
    )


DEFAULT_SPACE = SearchSpace(
    (
        Range("optim.lr", 1e-4, 1e-2, log=True),
        # The tables' own rate matters most for ids (Adagrad's default is 0.05).
        Range("optim.embedding_lr", 1e-3, 0.3, log=True),
        Range("optim.embedding_weight_decay", 1e-7, 1e-3, log=True),
        Choices("model.embedding_dim", (8, 16, 32, 64)),
        Choices("model.name", ("dlrm", "deepfm", "wide_deep")),
    )
)
"""What a study searches unless told: the rates and the tables' L2 on log scales, the embedding
width and the deep model. How long a trial trains is early stopping's choice (up to
``--epochs``), not the space's. The batch size is the one derived from the rows
(:mod:`flow.train_defaults`) unless ``--param batch_size=...`` searches it: fixed choices of
512-4,096 kept trials on 90,000 rows away from the derived 256 that served them best
(docs/trainers.md, "Tuning")."""


@dataclass(frozen=True)
class TuneConfig:
    """A study: how many trials, for how long, over which space."""

    trials: int = 20
    """Trials to run at most."""
    timeout_s: float | None = None
    """Start no trial after this many seconds (the one running then finishes)."""
    space: SearchSpace = DEFAULT_SPACE
    patience: int = 2
    """Early stopping's patience for trials run without ``--early-stop``: evaluations without
    improvement before a trial stops."""

    def __post_init__(self) -> None:
        if isinstance(self.trials, bool) or self.trials < 1:
            raise ConfigError(f"--trials {self.trials}: give 1 or more")
        if self.timeout_s is not None and not (
            math.isfinite(self.timeout_s) and self.timeout_s > 0
        ):
            raise ConfigError(f"--timeout {self.timeout_s}: give seconds > 0")
        if self.patience < 1:
            raise ConfigError(f"TuneConfig.patience is {self.patience}; give 1 or more")
