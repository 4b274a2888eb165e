"""Impressions with a known click model and click delays, emitted as the immediate strategy does.

Each impression has three features and a true click probability from a logistic model; a click
comes after an exponential delay and counts if it lands inside the attribution window. The
``immediate`` strategy emits every impression at its time as a negative, and again as a positive
at its click's time when that is inside the window; rows are ordered by emission time. The rate
a correct label would give (the ``window`` strategy's) is ``p * P(delay < window)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

COEFFICIENTS = np.array([0.8, -0.6, 0.4])
INTERCEPT = -1.1
MEAN_DELAY_S = 600.0
WINDOW_S = 1800.0
IN_WINDOW = 1.0 - np.exp(-WINDOW_S / MEAN_DELAY_S)
"""P(delay < window) for exponential delays: the share of clicks a window label counts."""


@dataclass(frozen=True)
class Impressions:
    features: np.ndarray
    """[impressions, 3] float32."""
    p_click: np.ndarray
    """True probability of a click within the window, per impression."""
    time_s: np.ndarray
    """Impression times (seconds from the start), ascending."""
    clicked: np.ndarray
    """A click came within the window."""
    click_s: np.ndarray
    """When the click came (NaN without one)."""

    @property
    def true_rate(self) -> float:
        """The expected positive rate of correct (window) labels."""
        return float(self.p_click.mean())


@dataclass(frozen=True)
class Rows:
    """Training rows as the immediate strategy emits them, in emission order."""

    features: np.ndarray
    label: np.ndarray
    emitted_s: np.ndarray
    event_s: np.ndarray
    """The impression's own time (a positive's event time is its impression's)."""
    p_click: np.ndarray
    impression: np.ndarray
    """Index of the impression a row belongs to."""


def impressions(n: int, seed: int = 0, span_s: float = 86_400.0) -> Impressions:
    rng = np.random.default_rng(seed)
    features = rng.normal(0.0, 1.0, (n, 3)).astype(np.float32)
    p = 1.0 / (1.0 + np.exp(-(INTERCEPT + features @ COEFFICIENTS)))
    time_s = np.sort(rng.uniform(0.0, span_s, n))
    delay = rng.exponential(MEAN_DELAY_S, n)
    clicked = (rng.random(n) < p) & (delay < WINDOW_S)
    click_s = np.where(clicked, time_s + delay, np.nan)
    return Impressions(features, p * IN_WINDOW, time_s, clicked, click_s)


def immediate_rows(found: Impressions) -> Rows:
    """Every impression a negative at its time, each click a positive at its time."""
    n = len(found.time_s)
    positive = np.flatnonzero(found.clicked)
    which = np.concatenate([np.arange(n), positive])
    label = np.concatenate([np.zeros(n), np.ones(len(positive))]).astype(np.float32)
    emitted = np.concatenate([found.time_s, found.click_s[positive]])
    order = np.argsort(emitted, kind="stable")
    which, label, emitted = which[order], label[order], emitted[order]
    return Rows(
        found.features[which],
        label,
        emitted,
        found.time_s[which],
        found.p_click[which],
        which,
    )
