"""Tracking pipeline runs in MLflow: one parent run per pipeline run, one nested run per stage.

Stages are tracked *around* transforms (``with tracker.stage("...")``), never inside them.
Trackers: :class:`MlflowTracker` (a tracking server) or :class:`NullTracker` (nowhere). Long
jobs log through :class:`ResilientRun`, whose calls never wait on the server: a bounded queue and
one sending thread carry them over an outage. Experiments are made of MLflow's classic
machine-learning kind, and links open its UI on the runs (:mod:`flow.tracking.experiments`).
"""

from __future__ import annotations

from flow.tracking.base import (
    PARENT_RUN_ENV,
    MetricPoint,
    NullTracker,
    Run,
    Tracker,
    stack_versions,
)
from flow.tracking.experiments import (
    EXPERIMENT_KIND_TAG,
    MACHINE_LEARNING_KIND,
    experiments_url,
    runs_url,
    training_experiment,
)
from flow.tracking.mlflow_tracker import CLIENT_LIMITS, MlflowTracker, bound_client_calls
from flow.tracking.resilient import ResilientRun

__all__ = [
    "CLIENT_LIMITS",
    "EXPERIMENT_KIND_TAG",
    "MACHINE_LEARNING_KIND",
    "PARENT_RUN_ENV",
    "MetricPoint",
    "MlflowTracker",
    "NullTracker",
    "ResilientRun",
    "Run",
    "Tracker",
    "bound_client_calls",
    "experiments_url",
    "runs_url",
    "stack_versions",
    "training_experiment",
]
