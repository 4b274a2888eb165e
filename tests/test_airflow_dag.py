"""The Airflow example (examples/schedulers/airflow_retrain_dag.py) parses under Airflow 3 with
no import error and no deprecation warning, and maps retrain's exit codes as docs/scheduling.md
says: 0 and 3 (kept) a success, 4 (nothing new) and 5 (busy) a skip.

Airflow is not one of the project's dependencies (it pins much of what the project pins), so it
lives in an environment of its own, whose interpreter ``TEST_AIRFLOW_PYTHON`` names:

    python3 -m venv /tmp/airflow-venv
    /tmp/airflow-venv/bin/pip install 'apache-airflow>=3,<4'
    TEST_AIRFLOW_PYTHON=/tmp/airflow-venv/bin/python pytest tests/test_airflow_dag.py

Without it, the test uses this interpreter if it imports ``airflow``, and is skipped otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO

DAG_FILE = REPO / "examples" / "schedulers" / "airflow_retrain_dag.py"
_PYTHON_ENV = "TEST_AIRFLOW_PYTHON"

# Run by Airflow's interpreter: Airflow's own DagBag (where Airflow 3 keeps it), as its DAG
# processor parses a file; what it found, as JSON on the last line.
_PARSE = r"""
import json, sys, warnings
try:
    from airflow.dag_processing.dagbag import DagBag
except ImportError:  # Airflow 3.0
    from airflow.models.dagbag import DagBag
import airflow
path = sys.argv[1]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    bag = DagBag(dag_folder=path)
dags = {}
for dag_id, dag in bag.dags.items():
    dags[dag_id] = {
        "schedule": str(getattr(dag, "schedule", None) or dag.timetable.summary),
        "max_active_runs": dag.max_active_runs,
        "catchup": dag.catchup,
        "tasks": [
            {
                "task_id": t.task_id,
                "operator": f"{type(t).__module__}.{type(t).__name__}",
                "bash_command": getattr(t, "bash_command", None),
                "skip_on_exit_code": sorted(getattr(t, "skip_on_exit_code", None) or []),
            }
            for t in dag.tasks
        ],
    }
warned = [f"{w.category.__name__}: {w.message}" for w in caught if w.filename == path]
print(json.dumps({"version": airflow.__version__, "errors": {str(k): str(v) for k, v in
      bag.import_errors.items()}, "dags": dags, "warnings": warned}))
"""


def _airflow_python() -> str:
    given = os.environ.get(_PYTHON_ENV)
    if given:
        if not Path(given).exists():
            pytest.fail(f"{_PYTHON_ENV}={given} does not exist; point it at a Python with Airflow")
        return given
    if importlib.util.find_spec("airflow") is not None:
        return sys.executable
    pytest.skip(
        f"Airflow is not installed here (it is no dependency of the project); set {_PYTHON_ENV} "
        "to an interpreter that has it (this module's docstring says how)"
    )


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    python = _airflow_python()
    home = tmp_path_factory.mktemp("airflow-home")
    done = subprocess.run(
        [python, "-c", _PARSE, str(DAG_FILE)],
        env={**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_dag_parses_under_airflow_3_without_errors_or_deprecations(
    parsed: dict[str, Any],
) -> None:
    assert parsed["version"].split(".")[0] == "3", parsed["version"]
    assert parsed["errors"] == {}
    assert parsed["warnings"] == []
    assert list(parsed["dags"]) == ["flow_retrain_ctr"]


def test_one_run_at_a_time_and_retrain_s_exit_codes_mapped(parsed: dict[str, Any]) -> None:
    dag = parsed["dags"]["flow_retrain_ctr"]
    assert dag["max_active_runs"] == 1
    assert dag["catchup"] is False
    (task,) = dag["tasks"]
    assert task["operator"] == "airflow.providers.standard.operators.bash.BashOperator"
    assert task["skip_on_exit_code"] == [4, 5]
    command = task["bash_command"]
    assert "flow retrain pipelines/ctr_backfill.py" in command
    assert "if [ $code -eq 3 ]; then exit 0; fi" in command
