"""Point-in-time history: what a key's earlier events say about the event at hand.

``History("user_rate", key="user_id", stat="mean", value="label")`` gives every event the mean
label of the same user's events strictly before it in event time (``within`` bounds how far
back). Recommendation data is dominated by keys a model has never seen as ids: on MovieLens 100K
split in time, 85 % of the held-out ratings are by users with no training rows, so their id
embeddings are untrained, while their own earlier ratings are known when they rate. Feature
stores call this a point-in-time aggregation (Chronon, Feathr, Tecton).

Computed by a backfill stage with a Spark window over the events' own columns; events at the
same instant do not see each other, so a label never leaks into a row of its own time. A stage
reading part of a table (a holdout's ``start``, an incremental ``since_snapshot``) reads the
earlier rows too, as context: a held-out event sees its key's training history, as a model
serving it would. A live stage has no history yet (it would need streaming state per key).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, get_args

from flow.errors import ConfigError
from flow.pipeline.schema import Definition, FieldType, check_identifier

__all__ = ["STATS", "History", "Stat"]

Stat = Literal["count", "sum", "mean"]
STATS: tuple[str, ...] = get_args(Stat)


@dataclass(frozen=True)
class History(Definition):
    """A column holding an aggregate of ``key``'s events strictly before each event.

    ``stat``: ``count`` (earlier events; of those with a non-null ``value`` if one is given),
    ``sum`` (of ``value``, 0 without earlier events) or ``mean`` (of ``value``, null without
    earlier events: the features' null handling applies). ``within``: only events at most this
    long before (None: all). ``key`` and ``value`` are columns of the stage's events (a label
    from a label join is not one yet). A null key gets a null.
    """

    name: str
    key: str
    stat: Stat = "count"
    value: str | None = None
    within: timedelta | None = None

    def __post_init__(self) -> None:
        check_identifier(self.name, "History.name")
        check_identifier(self.key, f"History({self.name!r}).key")
        owner = f"History({self.name!r})"
        if self.stat not in STATS:
            raise ConfigError(f"{owner}: stat={self.stat!r}; give one of {', '.join(STATS)}")
        if self.value is None and self.stat != "count":
            raise ConfigError(
                f"{owner}: stat={self.stat!r} needs a value column, e.g. value='label'"
            )
        if self.value is not None:
            check_identifier(self.value, f"{owner}.value")
        if self.within is not None and self.within <= timedelta(0):
            raise ConfigError(f"{owner}: within={self.within} must be positive, or None (all)")

    @property
    def type(self) -> FieldType:
        return "long" if self.stat == "count" else "double"

    @property
    def inputs(self) -> tuple[str, ...]:
        """The events' columns it reads."""
        return (self.key,) if self.value is None else (self.key, self.value)
