"""``flow submit``: a spark-submit command line that carries the stack's settings.

The user's own options win: a ``--conf`` key they give replaces ours, their ``--master`` replaces
the default, and their ``--jars`` / ``--driver-class-path`` are appended to the stack's
(spark-submit keeps only the last of each, so the two lists are merged into one).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from flow.config import LOOPBACK, StackConfig
from flow.engine import Launch
from flow.errors import ConfigError, DependencyMissingError
from flow.stack.jars import pyspark_jars_dir
from spark_jobs.conf import is_local_master, stack_conf
from spark_jobs.session import stack_jars

__all__ = [
    "SubmitArgs",
    "launch_env",
    "spark_submit_executable",
    "split_submit_argv",
    "submit_command",
    "submit_options",
]

#: spark-submit options that take no value; every other option takes one.
_FLAGS = frozenset({"--verbose", "-v", "--supervise", "--help", "-h", "--version"})
_MERGED = {"--jars": ",", "--driver-class-path": ":"}


@dataclass(frozen=True)
class SubmitArgs:
    """spark-submit's options, the application, and the application's arguments."""

    options: list[tuple[str, str | None]]
    app: str
    app_args: list[str]

    def value(self, name: str) -> str | None:
        found = [v for k, v in self.options if k == name]
        return found[-1] if found else None

    def conf_keys(self) -> set[str]:
        return {v.split("=", 1)[0] for k, v in self.options if k == "--conf" and v}


def split_submit_argv(argv: Sequence[str]) -> SubmitArgs:
    """Split ``[options] APP [args]`` as spark-submit does."""
    options: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-"):
            return SubmitArgs(options, arg, list(argv[i + 1 :]))
        if arg.startswith("--") and "=" in arg:
            name, value = arg.split("=", 1)
            options.append((name, value))
            i += 1
        elif arg in _FLAGS:
            options.append((arg, None))
            i += 1
        elif i + 1 < len(argv):
            options.append((arg, argv[i + 1]))
            i += 2
        else:
            raise ConfigError(f"spark-submit option {arg} needs a value")
    raise ConfigError(
        "no application given; usage: flow submit [spark-submit options] APP.py [args]"
    )


def spark_submit_executable() -> str:
    """pyspark's spark-submit beside this interpreter, else the first one on PATH."""
    beside = Path(sys.executable).parent / "spark-submit"
    if beside.exists():
        return str(beside)
    found = shutil.which("spark-submit")
    if found is None:
        raise DependencyMissingError("pyspark", "spark", "Submitting Spark jobs")
    return found


def _stack_options(stack: StackConfig, master: str) -> dict[str, str]:
    resolved = stack_jars(stack)
    return stack_conf(stack, resolved.jars, resolved.driver_classpath, master=master)


def _as_options(conf: dict[str, str], skip_conf: set[str]) -> list[str]:
    out = [
        "--jars",
        conf.pop("spark.jars"),
        "--driver-class-path",
        conf.pop("spark.driver.extraClassPath"),
    ]
    if "spark.driver.memory" in conf:
        out += ["--driver-memory", conf.pop("spark.driver.memory")]
    conf.pop("spark.master")
    for key, value in conf.items():
        if key not in skip_conf:
            out += ["--conf", f"{key}={value}"]
    return out


def submit_options(stack: StackConfig) -> list[str]:
    """Options for a plain ``spark-submit --master ... $(flow spark-args) app.py``."""
    return _as_options(_stack_options(stack, stack.spark.master), set())


def submit_command(argv: Sequence[str], stack: StackConfig) -> Launch:
    """The spark-submit launch of ``argv`` with the stack's settings under the user's."""
    args = split_submit_argv(argv)
    if not Path(args.app).exists():
        raise ConfigError(f"application {args.app} does not exist (relative to {Path.cwd()})")
    master = args.value("--master") or stack.spark.master
    conf = _stack_options(stack, master)
    if args.value("--driver-memory") is not None:
        conf.pop("spark.driver.memory", None)
    ours = _as_options(conf, args.conf_keys())

    user: list[str] = []
    for name, value in args.options:
        if name in _MERGED and value:
            at = ours.index(name) + 1
            ours[at] = _MERGED[name].join(filter(None, (ours[at], value)))
        else:
            user += [name] if value is None else [name, value]
    head = [] if args.value("--master") else ["--master", master]
    argv_out = [spark_submit_executable(), *head, *ours, *user, args.app, *args.app_args]
    return Launch(argv_out, launch_env(master))


def launch_env(master: str) -> dict[str, str]:
    """Environment for spark-submit: pyspark's Spark, and this interpreter for the driver.

    pyspark's spark-submit script otherwise finds its home, and runs the application, with
    whatever ``python3`` is first on PATH, which need not have this project installed. Values the
    user exported win.
    """
    env = {
        "SPARK_HOME": os.environ.get("SPARK_HOME") or str(pyspark_jars_dir().parent),
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON") or sys.executable,
        "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON") or sys.executable,
    }
    if is_local_master(master):
        env["SPARK_LOCAL_IP"] = LOOPBACK
    return env
