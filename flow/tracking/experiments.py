"""Experiments of the classic machine-learning kind, and links that open MLflow's UI on runs.

MLflow 3's UI has two modes: "GenAI" (traces, evaluations, judges, prompts) and "Model
training" (runs, models, the registry). Without help it opens in GenAI, where a pipeline's runs
are hidden behind a "Traces 0" page. Two things choose the mode, and the project sets both:

- the experiment tag ``mlflow.experimentKind``: ``custom_model_development`` is the
  machine-learning kind (MLflow's ``ExperimentKind``; its own demo data sets the tag the same
  way). Versions whose experiment page reads the kind from the experiment honour it;
- the ``workflowType`` query parameter of the UI's address. MLflow 3.17's UI (its workflow
  switcher) takes the mode from ``?workflowType=machine_learning`` first, then from the mode
  the browser last chose, and defaults to GenAI: the experiment's tag alone does not open a
  fresh browser on the runs. Every link the project prints carries the parameter.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "EXPERIMENT_KIND_TAG",
    "MACHINE_LEARNING_KIND",
    "MACHINE_LEARNING_WORKFLOW",
    "experiments_url",
    "runs_url",
    "training_experiment",
]

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
"""The experiment tag MLflow's UI reads for an experiment's kind."""

MACHINE_LEARNING_KIND = "custom_model_development"
"""The kind MLflow's UI shows as "Machine learning": runs first, no traces or judges."""

MACHINE_LEARNING_WORKFLOW = "workflowType=machine_learning"
"""The query that opens MLflow 3's UI in its "Model training" mode."""


def training_experiment(client: Any, name: str) -> str:
    """The id of experiment ``name`` on ``client``'s server, created of the machine-learning
    kind if it does not exist and tagged so if it exists without a kind.

    ``client`` is an ``mlflow.MlflowClient``. Call it only where a run is about to be logged
    into the experiment: an experiment with no runs is clutter in the UI's list. A kind someone
    chose for an existing experiment is kept.
    """
    found = client.get_experiment_by_name(name)
    if found is None:
        from mlflow.exceptions import MlflowException

        try:
            return str(
                client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: MACHINE_LEARNING_KIND})
            )
        except MlflowException as exc:
            # Another process created it between the lookup and here: use theirs.
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
    if not found.tags.get(EXPERIMENT_KIND_TAG):
        client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, MACHINE_LEARNING_KIND)
    return str(found.experiment_id)


def runs_url(tracking_uri: str, experiment_id: str, run_id: str | None = None) -> str:
    """The UI's page of one run (with its nested stage runs listed as child runs), or of the
    experiment's runs table without ``run_id``, in the "Model training" mode."""
    page = f"experiments/{experiment_id}/runs" + (f"/{run_id}" if run_id else "")
    return f"{tracking_uri.rstrip('/')}/#/{page}?{MACHINE_LEARNING_WORKFLOW}"


def experiments_url(tracking_uri: str) -> str:
    """The UI's list of experiments, in the "Model training" mode."""
    return f"{tracking_uri.rstrip('/')}/#/experiments?{MACHINE_LEARNING_WORKFLOW}"
