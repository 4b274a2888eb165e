"""Airflow 3: retrain the CTR model daily with `flow retrain` (one run at a time).

`flow retrain` exits 0 when it promoted the new model, 3 when the champion stays, 4 when there
was nothing new to train on and 5 when another retraining of the pipeline was running; 1 is an
error. Here a kept champion is a success, nothing new or busy a skip, anything else a failure.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

FLOW_HOME = "/opt/primus-flow"  # the checkout, with its .venv (make demo / make test made it)

with DAG(
    dag_id="flow_retrain_ctr",
    schedule="0 3 * * *",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,  # never two retrainings at once (flow retrain also locks)
    default_args={"retries": 1, "retry_delay": timedelta(minutes=10)},
) as dag:
    BashOperator(
        task_id="retrain",
        cwd=FLOW_HOME,
        # 3 (kept) -> success; 4 (nothing new) and 5 (busy) -> skipped.
        bash_command=(
            ".venv/bin/flow retrain pipelines/ctr_backfill.py --model-name ctr; "
            "code=$?; if [ $code -eq 3 ]; then exit 0; fi; exit $code"
        ),
        skip_on_exit_code=[4, 5],
    )
