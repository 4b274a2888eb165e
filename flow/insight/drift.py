"""Drift between two profiles of training rows: population stability index per feature.

PSI = sum over bins of (now - before) * ln(now / before), bins being the previous run's deciles
for numbers and its most frequent indices (plus "the rest") for categories. Rules of thumb:
under 0.1 stable, 0.1-0.2 a shift worth a look, over 0.2 drifted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from flow.insight.profile import CategoricalStats, Profile

__all__ = ["DRIFTED", "Drift", "compare", "psi"]

DRIFTED = 0.2
_EPS = 1e-4


def psi(before: Sequence[float] | np.ndarray, now: Sequence[float] | np.ndarray) -> float:
    """The population stability index of two histograms over the same bins."""
    b = np.asarray(before, dtype=np.float64)
    n = np.asarray(now, dtype=np.float64)
    if b.sum() == 0 or n.sum() == 0:
        return 0.0
    b = np.clip(b / b.sum(), _EPS, None)
    n = np.clip(n / n.sum(), _EPS, None)
    return float(np.sum((n - b) * np.log(n / b)))


def _categorical(before: CategoricalStats, now: CategoricalStats) -> float:
    keys = list(before.top)
    b = [before.top[k] for k in keys] + [before.count - sum(before.top.values())]
    n = [now.top.get(k, 0) for k in keys]  # counted exactly: the profile had this reference
    rest = now.count - sum(n)
    return psi(b, [*n, max(rest, 0)])


@dataclass(frozen=True)
class Drift:
    feature: str
    kind: str
    psi: float

    @property
    def drifted(self) -> bool:
        return self.psi >= DRIFTED


def compare(before: Profile, now: Profile) -> list[Drift]:
    """Every feature both profiles have, most drifted first."""
    found = [
        Drift(name, "numeric", psi(before.numeric[name].counts, stats.counts))
        for name, stats in now.numeric.items()
        if name in before.numeric and before.numeric[name].edges == stats.edges
    ]
    found += [
        Drift(name, "categorical", _categorical(before.categorical[name], stats))
        for name, stats in now.categorical.items()
        if name in before.categorical
    ]
    return sorted(found, key=lambda d: -d.psi)
