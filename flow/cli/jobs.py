"""``flow submit``, ``flow run``, ``flow spark-args``, ``flow bench``: Spark jobs on the stack."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
from rich.markup import escape

from flow.cli.common import console, emit_json, friendly, progress, stack_config
from flow.cli.local import stack_up
from flow.config import BENCH_RESULT_ENV, RUN_RESULT_ENV, StackConfig
from flow.console import DEBUG_ENV
from flow.errors import FlowError
from flow.secrets import redact_argv
from flow.terminal import Start, call, inherit, to_stderr

if TYPE_CHECKING:
    from flow.workflows.together import Together

__all__ = [
    "bench", "launch", "on_warm_driver", "own_options_first", "run", "spark_args",
    "spark_launcher", "submit",
]  # fmt: skip

_passthrough = {"ignore_unknown_options": True, "allow_interspersed_args": False}

#: spark-submit's options that take no value (SparkSubmitOptionParser's switches); every other
#: spark-submit option takes one, as the next word or after ``=``.
SPARK_SWITCHES = frozenset(
    {"--help", "-h", "--supervise", "--usage-error", "--verbose", "-v", "--version"}
)
#: Where APP and its arguments start, in a command's usage and help.
_APP = "[SPARK-SUBMIT OPTIONS] APP [APP ARGS]..."


def own_options_first(args: Sequence[str], own: dict[str, bool]) -> list[str]:
    """``args`` with ``flow``'s own options (``own``: name -> takes a value) moved before
    spark-submit's, so that they are recognised wherever they stand before APP.

    Click stops reading options at the first word it does not know (spark-submit's
    ``--master``), after which ``--train`` would reach spark-submit. APP is the first word that
    is neither an option nor an option's value; from APP on, every word is the application's.
    """
    first: list[str] = []
    rest: list[str] = []
    words = list(args)
    i = 0
    while i < len(words):
        word = words[i]
        name = word.split("=", 1)[0]
        if name in own:
            takes = own[name] and "=" not in word
            first += words[i : i + 1 + takes]
            i += 1 + takes
        elif word == "--":
            break
        elif word.startswith("-") and len(word) > 1:
            takes = "=" not in word and word not in SPARK_SWITCHES
            rest += words[i : i + 1 + takes]
            i += 1 + takes
        else:
            break  # APP
    return [*first, *rest, *words[i:]]


class _FlowThenSpark(click.Command):
    """A command of flow's options and spark-submit's, in any order before APP."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        own: dict[str, bool] = {}
        for param in self.get_params(ctx):
            if isinstance(param, click.Option):
                for name in [*param.opts, *param.secondary_opts]:
                    own[name] = not param.is_flag
        return super().parse_args(ctx, own_options_first(args, own))


def _abbreviated(argv: Sequence[str]) -> str:
    """The command line for the terminal: secrets redacted, long jar lists shortened to a count."""
    shown = [
        f"<{a.count(',') + 1} jars>" if a.count(",") > 3 and ".jar" in a else a
        for a in redact_argv(argv)
    ]
    return shlex.join(shown)


def launch(
    argv: Sequence[str],
    stack: StackConfig,
    extra: dict[str, str] | None = None,
    connectors: frozenset[str] | None = None,
    start: Start = inherit,
    say: Callable[[str], None] | None = None,
) -> int:
    """Run ``argv`` through spark-submit with the stack, with only ``connectors`` (None: all).
    ``start`` starts spark-submit and ``say`` says what is started (default: both on this
    terminal; flow demo relays them as the lines of its ``spark`` source)."""
    from flow.engine import load_engine

    def dim(message: str) -> None:
        console.print(f"[dim]{escape(message)}[/]", highlight=False, soft_wrap=True)

    note = say or dim
    launch = load_engine("spark").submit_command(list(argv), stack, connectors)
    if connectors is not None:
        named = ", ".join(sorted(connectors)) or "none"
        note(f"connectors beside Iceberg: {named} (--connectors all: every jar)")
    note(f"$ {_abbreviated(launch.argv)}")
    for line in launch.notes:
        note(line)
    code = 1
    try:
        code = call(start, launch.argv, {**os.environ, **launch.env, **(extra or {})})
        return code
    finally:
        # spark-submit reads its properties file when it starts (in cluster mode it ships the
        # settings with the application): once it has ended, nothing reads the file.
        for path in launch.private_files:
            path.unlink(missing_ok=True)
        for finish in launch.on_exit:
            finish(code)


def _app_file(argv: Sequence[str]) -> str | None:
    return next((a for a in argv if a.endswith(".py")), None)


def _said_failed(code: int, argv: Sequence[str]) -> None:
    """A failed job gets one line saying so (the job has printed why: ``flow`` adds no
    traceback of its own)."""
    if code:
        console.print(
            f"[bold red]flow:[/] {escape(_app_file(argv) or 'the job')} exited with code {code}; "
            f"its output above says why (flow --debug, or {DEBUG_ENV}=1, adds tracebacks)",
            highlight=False,
            soft_wrap=True,
        )


def _exit(code: int, argv: Sequence[str]) -> NoReturn:
    """Exit with the job's code, saying so when it failed."""
    _said_failed(code, argv)
    raise SystemExit(code)


def spark_launcher(
    stack: StackConfig,
    connectors: str | None = None,
    warm: bool = False,
    start: Start = inherit,
    say: Callable[[str], None] | None = None,
    stdout_to_stderr: bool = False,
) -> Callable[[Sequence[str], dict[str, str]], int]:
    """``launch`` on ``stack``, for the commands that start Spark jobs of their own, with
    ``connectors`` (``--connectors``); None: those the job's pipeline needs (all for a file
    that is not a pipeline file). With ``warm``, a job the warm driver can run goes to it.
    ``start`` and ``say``: see :func:`launch`. With ``stdout_to_stderr`` (``--json``), the
    job's output goes to stderr, on its own driver or the warm one."""
    from flow.workflows.together import pipeline_connectors

    begin = to_stderr if stdout_to_stderr else start

    def spark(argv: Sequence[str], extra: dict[str, str]) -> int:
        chosen = pipeline_connectors(argv) if connectors is None else _connectors(connectors)
        code = on_warm_driver(argv, stack, extra, chosen, stdout_to_stderr) if warm else None
        return launch(argv, stack, extra, chosen, begin, say) if code is None else code

    return spark


def _job_output(text: str, fd: int) -> None:
    stream = sys.stdout if fd == 1 else sys.stderr
    stream.write(text)
    stream.flush()


def _job_output_to_stderr(text: str, fd: int) -> None:
    _job_output(text, 2)


def on_warm_driver(
    argv: Sequence[str],
    stack: StackConfig,
    extra: dict[str, str],
    connectors: frozenset[str] | None,
    stdout_to_stderr: bool = False,
) -> int | None:
    """The exit code of ``argv`` run on the warm driver (``flow driver start``); None when
    none runs or it cannot take this job (said in one line: the job then starts its own).
    With ``stdout_to_stderr``, the job's stdout is written to stderr here."""
    from flow.workflows.warm import (
        JobRequest,
        app_argv,
        describe,
        find_driver,
        job_env,
        run_on_driver,
    )

    state = find_driver(stack.home)
    if state is None:
        return None
    app = app_argv(argv)
    if app is None:
        why: str | None = "spark-submit options come before the application"
    else:
        why = state.refusal(stack, stack.spark.master, connectors)
    if app is not None and why is None:
        console.print(f"[dim]on the warm driver ({escape(describe(state))})[/]", highlight=False)
        request = JobRequest(argv=app, cwd=os.getcwd(), env=job_env(extra))
        output = _job_output_to_stderr if stdout_to_stderr else _job_output
        result = run_on_driver(state, request, output)
        if isinstance(result, int):
            return result
        why = result
    console.print(f"[dim]not on the warm driver: {escape(str(why))}[/]", highlight=False)
    return None


_CONNECTORS_HELP = (
    "Spark connectors beside Iceberg's to put on the job: all, none, or a comma list of "
    "kafka,delta; fewer jars start the driver faster."
)


def _connectors(text: str | None) -> frozenset[str] | None:
    from flow.engine import parse_connectors

    return None if text is None else parse_connectors(text)


@click.command(cls=_FlowThenSpark, context_settings=_passthrough)
@click.option("--connectors", metavar="LIST", default="all", help=_CONNECTORS_HELP)
@click.argument("argv", nargs=-1, type=click.UNPROCESSED, required=True, metavar=_APP)
@friendly
def submit(argv: tuple[str, ...], connectors: str) -> None:
    """spark-submit APP with the stack's jars, catalogs and Kafka settings.

    Options before APP go to spark-submit and win over the stack's (--master, --conf k=v, ...);
    arguments after APP go to the application. --connectors (anywhere before APP) leaves out
    the jars of connectors APP does not use.
    """
    _exit(launch(argv, stack_config(), connectors=_connectors(connectors)), argv)


@click.command(cls=_FlowThenSpark, context_settings=_passthrough)
@click.option(
    "--train",
    "train_args",
    metavar="ARGS",
    help='Also run a trainer following the job\'s channels: "--channel live --model dlrm ...".',
)
@click.option(
    "--train-config",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The trainer's settings as a JSON file (TrainConfig); --train options override it.",
)
@click.option("--train-procs", default=1, show_default=True, help="Trainer processes (ranks).")
@click.option(
    "--connectors",
    metavar="LIST",
    default=None,
    help=_CONNECTORS_HELP + " Default: those the pipeline's sources need (all for a file "
    "that is not a pipeline file).",
)
@click.option(
    "--cold",
    is_flag=True,
    help="Start a driver of its own even when a warm one (flow driver start) could run it.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the outcome as JSON on stdout: the MLflow run, each stage's counts, the exit "
    "code (the job's output goes to stderr then).",
)
@click.argument("argv", nargs=-1, type=click.UNPROCESSED, required=True, metavar=_APP)
@friendly
def run(
    argv: tuple[str, ...],
    train_args: str | None,
    train_config: Path | None,
    train_procs: int,
    connectors: str | None,
    cold: bool,
    as_json: bool,
) -> None:
    """Bring the local stack up, then submit APP on it (like `flow submit`).

    flow's options below go anywhere before APP, before or after spark-submit's (--master,
    --conf k=v, ...); words after APP are the application's arguments.

    With --train or --train-config, a trainer (torchrun -m trainers train, following the job's
    channels) runs beside the job and both nest under one MLflow run; the trainer ends after
    the job, once it has read everything. `python -m trainers train --help` lists its settings.

    While a warm driver runs (flow driver start), the job runs on it when it can (said in one
    line either way): a short job then takes seconds instead of a driver's start.

    With --json, stdout holds one JSON object once the job has run, whatever its exit code:
    exit_code, the pipeline's MLflow run, and each stage that ended with its counts (stages is
    null for a file that is not a pipeline, a job that failed before its pipeline run began, or
    a driver on another machine: --deploy-mode cluster); with --train, also spark_exit_code and
    the trainer's exit code, MLflow run, figures and the file of its whole result. A mistake
    found before the job starts prints no JSON.
    """
    trainer = None
    if train_args is not None or train_config is not None:
        from flow.training import parse_args

        given = ["--config", str(train_config)] if train_config else []
        trainer = parse_args([*given, *shlex.split(train_args or "")], prog="flow run --train")
    _connectors(connectors)  # a mistake in it is told before the stack starts
    from flow.workflows.precheck import check_pipeline_file
    from flow.workflows.together import run_together

    with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
        check_pipeline_file(argv)  # and one in the pipeline file
    stack = stack_up()
    spark = spark_launcher(stack, connectors, warm=not cold, stdout_to_stderr=as_json)
    if not as_json:
        if trainer is None:
            _exit(spark(argv, {}), argv)
        raise SystemExit(run_together(argv, trainer, train_procs, stack, spark, progress).code)
    with tempfile.TemporaryDirectory(prefix="flow-run-") as folder:
        result = Path(folder) / "result.json"

        def job(job_argv: Sequence[str], extra: dict[str, str]) -> int:
            return spark(job_argv, {**extra, RUN_RESULT_ENV: str(result)})

        if trainer is None:
            code, together = job(argv, {}), None
        else:
            together = run_together(
                argv, trainer, train_procs, stack, job, progress, start_trainer=to_stderr
            )
            code = together.code
        driver = json.loads(result.read_text()) if result.exists() else {}
    _said_failed(code, argv)
    emit_json(_run_outcome(argv, code, driver, together))
    raise SystemExit(code)


def _run_outcome(
    argv: Sequence[str], code: int, driver: dict[str, Any], together: Together | None
) -> dict[str, Any]:
    """``flow run --json``'s object: the exit code, what the driver wrote of its pipeline run
    (``driver``: empty when it wrote nothing) and, with a trainer, how it ended."""
    outcome: dict[str, Any] = {
        "app": _app_file(argv),
        "exit_code": code,
        "pipeline": driver.get("pipeline"),
        "mlflow_run_id": driver.get("mlflow_run_id"),
        "mlflow_url": driver.get("mlflow_url"),
        "stages": driver.get("stages"),
    }
    if together is None:
        return outcome
    found = together.trainer_result
    if found is not None and not found.exists():
        found = None  # it failed before it wrote one
    trained: dict[str, Any] = json.loads(found.read_text()) if found is not None else {}
    outcome["mlflow_run_id"] = together.run_id  # both parts nested under it
    outcome["spark_exit_code"] = together.spark_code
    outcome["trainer"] = {
        "exit_code": together.trainer_code,
        "mlflow_run_id": trained.get("run_id"),
        "model_version": trained.get("model_version"),
        "steps": trained.get("steps"),
        "rows": trained.get("rows"),
        "samples_per_s": trained.get("samples_per_s"),
        "metrics": trained.get("metrics"),
        "result_file": str(found) if found is not None else None,
    }
    return outcome


_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _benchmarks() -> str:
    """The benchmarks of this checkout, for ``flow bench --help``."""
    names = sorted(p.stem for p in _BENCHMARKS.glob("*.py") if not p.stem.startswith("_"))
    return ", ".join(names) or "none found"


@click.command(context_settings=_passthrough, epilog=f"Benchmarks: {_benchmarks()}.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the result the benchmark saved as JSON on stdout (its own output goes to "
    "stderr then). Give it before NAME.",
)
@click.argument("name")
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
@friendly
def bench(name: str, argv: tuple[str, ...], as_json: bool) -> None:
    """Run benchmarks/NAME.py on the local stack (arguments after NAME go to the benchmark;
    `flow bench NAME --help` shows them). Results print and go to $FLOW_HOME/bench/.

    Exit code: the benchmark's. With --json, a benchmark that ends well but saved no result is
    an error (exit 1); one that fails prints nothing on stdout.
    """
    script = Path("benchmarks") / f"{name}.py"
    if not script.exists():
        found = sorted(p.stem for p in Path("benchmarks").glob("*.py"))
        raise FlowError(
            f"no benchmark {name!r} in {Path('benchmarks').resolve()}; benchmarks: "
            f"{', '.join(found) or 'none (run from the project folder)'}"
        )
    # Help is the script's argparse: plain Python, no services or Spark started for it.
    asks_help = any(a in ("-h", "--help") for a in argv)
    if not as_json or asks_help:
        raise SystemExit(_run_bench(script, argv, asks_help, inherit, {}))
    with tempfile.TemporaryDirectory(prefix="flow-bench-") as folder:
        result = Path(folder) / "result.json"
        code = _run_bench(script, argv, asks_help, to_stderr, {BENCH_RESULT_ENV: str(result)})
        if code:
            raise SystemExit(code)
        if not result.exists():
            raise FlowError(
                f"benchmark {name!r} exited 0 but saved no result for --json ({script} does "
                "not save it through benchmarks/_results.py); run it without --json"
            )
        emit_json(json.loads(result.read_text()))


def _run_bench(
    script: Path, argv: Sequence[str], asks_help: bool, start: Start, extra: dict[str, str]
) -> int:
    """Run ``script`` with ``argv``, started by ``start`` with ``extra`` variables; its code."""
    # A benchmark that needs no Kafka or MLflow says so: on two cores, idle services still
    # take a share of the CPU it measures. One that needs no Spark runs as plain Python, so
    # it runs where there is no Java (a bare GPU machine).
    needs_services = flag(script, "NEEDS_SERVICES") and not asks_help
    stack = stack_up() if needs_services else stack_config()
    if asks_help or not flag(script, "NEEDS_SPARK"):
        return call(start, [sys.executable, str(script), *argv], {**os.environ, **extra})
    return launch(["--driver-memory", "4g", str(script), *argv], stack, extra, start=start)


def flag(script: Path, name: str) -> bool:
    """False when the benchmark sets ``NAME = False`` at module level; True otherwise."""
    for node in ast.parse(script.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            and isinstance(node.value, ast.Constant)
        ):
            return bool(node.value.value)
    return True


@click.command(context_settings={**_passthrough, "help_option_names": []}, add_help_option=False)
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def train(argv: tuple[str, ...]) -> None:
    """Train a model on handoff channels (python -m trainers train, under the CLI's name).

    Every option is the trainer's (``flow train --help`` lists them); for several processes,
    ``torchrun ... -m trainers train`` as docs/trainers.md shows.
    """
    raise SystemExit(subprocess.call([sys.executable, "-m", "trainers", "train", *argv]))


@click.command("spark-args")
@click.option(
    "--master",
    default=None,
    help="The master the job is submitted to (default: FLOW_SPARK_MASTER, local[*]); give the "
    "same as to spark-submit: for a cluster only portable settings are printed.",
)
@friendly
def spark_args(master: str | None) -> None:
    """Print the spark-submit options that give a job the stack (for a plain spark-submit).

    spark-submit --master URL $(flow spark-args --master URL) app.py

    Secret settings (FLOW_CATALOG_PROPERTIES credentials, ...) are not printed: they go to
    $FLOW_HOME/private/spark-args.properties (readable by you only, rewritten by each call),
    given as --properties-file with --load-spark-defaults. A --properties-file of your own
    would replace it: use `flow submit`, which merges the two.
    """
    from flow.engine import load_engine

    options = load_engine("spark").submit_options(stack_config(), master)
    click.echo(" ".join(shlex.quote(o) for o in options))
