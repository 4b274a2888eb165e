"""``flow``: the command line of Primus Flow.

    flow services up | down | status     the embedded local stack
    flow ui                              the MLflow UI of the local stack
    flow jars fetch | list               JVM artifacts in the project-local cache
    flow load FILE --table NS.NAME       a CSV, Parquet or JSON-lines file into Iceberg
    flow import criteo FILE --table NS.NAME   the Criteo display-ads format into Iceberg
    flow submit [spark-submit options] APP.py [args]
    flow demo                            the whole product end to end on the local stack
    flow insight RUN_ID                  training-data statistics, plots and drift of a run
    flow retrain APP.py                  incremental retraining, promoted only if not worse
    flow schedule APP.py --cron "..."    retraining on a schedule, one run at a time
    flow run APP.py [args]               services up, then submit on the local stack
    flow train [trainer options]         train on handoff channels (python -m trainers train)
    flow tune [--trials N] [trainer options]   search the trainer's settings (Optuna)
    flow driver start | stop | status    a warm Spark driver that flow run hands jobs to
    flow spark-args                      the options to give a plain spark-submit
    flow handoff ls | show | verify | close | retire | drop
                                         handoff channels (see flow/cli/channels.py)
    flow check consistency NS CHANNEL    committed features against the Python transform
    flow bench NAME [args]               benchmarks/NAME.py on the local stack
    flow compose check [FILE]            each service's settings in a compose file, checked
    flow --debug COMMAND ...             errors with their traceback (also FLOW_DEBUG=1)

Heavy imports (pyiceberg, MLflow, Kafka clients) happen inside the commands that need them, so
``flow --help`` stays instant.
"""

from __future__ import annotations

import os
import sys

import click

from flow.cli import channels, check, data, deploy, driver, ingest, jobs, lifecycle, local, tune
from flow.console import DEBUG_ENV, DEBUG_FLAG

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="primus-flow")
@click.option(
    DEBUG_FLAG,
    is_flag=True,
    help=f"Show the traceback of an error, also in the jobs a command starts ({DEBUG_ENV}=1).",
)
def main(debug: bool) -> None:
    """Primus Flow: Kafka + Iceberg + Spark into PyTorch trainers, tracked in MLflow.

    A mistake ends a command with one line, "error: ..."; --debug adds its traceback.
    """
    if debug:
        # Through the environment, so that Spark jobs and trainers started here see it too.
        os.environ[DEBUG_ENV] = "1"


for command in (
    local.services,
    local.ui,
    local.jars,
    data.generate,
    ingest.load,
    ingest.import_,
    jobs.submit,
    jobs.run,
    driver.driver,
    jobs.spark_args,
    jobs.bench,
    jobs.train,
    tune.tune,
    lifecycle.demo,
    lifecycle.retrain,
    lifecycle.schedule,
    lifecycle.insight,
    channels.handoff,
    check.check,
    deploy.compose,
):
    main.add_command(command)


if __name__ == "__main__":  # pragma: no cover - `python -m flow.cli`
    sys.exit(main())
