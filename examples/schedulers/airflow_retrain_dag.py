"""Airflow: retrain the CTR model daily with the same command (max one active run)."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow import DAG
from airflow.operators.bash import BashOperator

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
        bash_command=(
            "cd /opt/primus-flow && "
            ".venv/bin/flow retrain pipelines/ctr_backfill.py --model-name ctr"
        ),
    )
