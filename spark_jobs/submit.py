"""``flow submit``: a spark-submit command line that carries the stack's settings.

The user's own options win: a ``--conf`` key they give replaces ours, their ``--master`` replaces
the default, their ``--properties-file`` overrides the stack's ``--conf`` settings, and their
``--jars`` / ``--driver-class-path`` are appended to the stack's (spark-submit keeps only the last
of each, so the two lists are merged into one).

Secrets stay off the command line, which every local user can read in ``ps`` (spark-submit's
JVM is also the driver's in client mode). Settings that look secret
(:func:`flow.secrets.is_secret`), the stack's and the user's, go to a ``--properties-file`` in
``$FLOW_HOME/private`` that only this user can read. spark-submit ranks ``--conf`` over that file
over ``spark-defaults.conf``, which it reads beside the file only with ``--load-spark-defaults``:
added unless the user gives a file of their own, which then (as in a plain spark-submit) replaces
spark-defaults.conf. Their file is copied into ours after the stack's settings (the last line of
a key wins), and all the stack's ``--conf`` settings move into ours, so that theirs win.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from flow.config import LOOPBACK, StackConfig
from flow.engine import Launch
from flow.errors import ConfigError, DependencyMissingError
from flow.secrets import is_secret, new_private_file, rewrite_private_file
from flow.stack.jars import pyspark_jars_dir
from spark_jobs.cds import MAKING_ARCHIVE, archive_options
from spark_jobs.conf import is_local_master, stack_conf
from spark_jobs.session import stack_jars

__all__ = [
    "SPARK_ARGS_FILE",
    "SubmitArgs",
    "launch_env",
    "properties_text",
    "spark_submit_executable",
    "split_submit_argv",
    "submit_command",
    "submit_options",
]

#: spark-submit options that take no value; every other option takes one.
_FLAGS = frozenset(
    {"--verbose", "-v", "--supervise", "--help", "-h", "--version", "--load-spark-defaults"}
)
_CONF = frozenset({"--conf", "-c"})
_MERGED = {"--jars": ",", "--driver-class-path": ":"}

#: The file ``flow spark-args`` writes in ``$FLOW_HOME/private``.
SPARK_ARGS_FILE = "spark-args.properties"


@dataclass(frozen=True)
class SubmitArgs:
    """spark-submit's options, the application, and the application's arguments."""

    options: list[tuple[str, str | None]]
    app: str
    app_args: list[str]

    def value(self, name: str) -> str | None:
        found = [v for k, v in self.options if k == name]
        return found[-1] if found else None

    def confs(self) -> dict[str, str]:
        """The ``--conf k=v`` settings (the last of a key wins, as in spark-submit)."""
        pairs = (v.partition("=") for k, v in self.options if k in _CONF and v and "=" in v)
        return {key: value for key, _, value in pairs}


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


def _stack_options(
    stack: StackConfig, master: str, connectors: frozenset[str] | None
) -> dict[str, str]:
    resolved = stack_jars(stack, connectors)
    return stack_conf(
        stack, resolved.jars, resolved.driver_classpath, master=master, connectors=connectors
    )


def _launch_options(conf: dict[str, str]) -> list[str]:
    """spark-submit's own options for the launch settings, taken out of ``conf``."""
    conf.pop("spark.master")
    out = [
        "--jars",
        conf.pop("spark.jars"),
        "--driver-class-path",
        conf.pop("spark.driver.extraClassPath"),
    ]
    if "spark.driver.memory" in conf:
        out += ["--driver-memory", conf.pop("spark.driver.memory")]
    return out


def _conf_options(conf: Mapping[str, str]) -> list[str]:
    return [arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]


_ESCAPES = str.maketrans(
    {"\\": "\\\\", "=": "\\=", ":": "\\:", "#": "\\#", "!": "\\!", "\t": "\\t",
     "\n": "\\n", "\r": "\\r", "\f": "\\f"}
)  # fmt: skip


def _escaped(text: str, *, key: bool) -> str:
    """``text`` as java.util.Properties reads it back (what ``Properties.store`` writes)."""
    out = text.translate(_ESCAPES)
    if key:
        return out.replace(" ", "\\ ")
    return "\\" + out if out.startswith(" ") else out


def properties_text(conf: Mapping[str, str], heading: str) -> str:
    """``conf`` in the properties format spark-submit reads (UTF-8), under a ``#`` heading."""
    lines = [f"# {heading}"]
    lines += [f"{_escaped(k, key=True)}={_escaped(v, key=False)}" for k, v in conf.items()]
    return "\n".join(lines) + "\n"


def submit_options(
    stack: StackConfig, master: str | None = None, connectors: frozenset[str] | None = None
) -> list[str]:
    """Options for a plain ``spark-submit --master MASTER $(flow spark-args --master MASTER)``.

    For a non-local ``master`` (default: the stack's) only what is portable: no loopback
    addresses, local shuffle tuning, driver memory or local Python daemon. The secret settings
    are written to ``$FLOW_HOME/private/spark-args.properties`` (0600, rewritten by each call)
    and given as ``--properties-file`` with ``--load-spark-defaults``. ``connectors`` (None:
    all) leaves the others' jars and session settings out.
    """
    conf = _stack_options(stack, master or stack.spark.master, connectors)
    options = _launch_options(conf)
    secret = {k: v for k, v in conf.items() if is_secret(k, v)}
    options += _conf_options({k: v for k, v in conf.items() if k not in secret})
    if secret:
        text = properties_text(secret, "The stack's secret settings, written by `flow spark-args`")
        path = rewrite_private_file(stack.home, SPARK_ARGS_FILE, text)
        options += ["--properties-file", str(path), "--load-spark-defaults"]
    return options


def _users_properties(name: str) -> str:
    path = Path(name)
    if not path.is_file():
        raise ConfigError(f"--properties-file {name} does not exist (relative to {Path.cwd()})")
    # Spark reads it as UTF-8 and puts U+FFFD for what is not.
    text = path.read_text(encoding="utf-8", errors="replace")
    # A blank line ends a last line continued by a backslash before what follows it.
    return f"# From {path.resolve()}\n{text}\n\n"


def submit_command(
    argv: Sequence[str], stack: StackConfig, connectors: frozenset[str] | None = None
) -> Launch:
    """The spark-submit launch of ``argv`` with the stack's settings under the user's; with
    ``connectors`` (None: all), without the others' jars and session settings.

    What looks secret goes to a file in ``$FLOW_HOME/private`` (:attr:`Launch.private_files`),
    which whoever runs the launch deletes when it ends.
    """
    args = split_submit_argv(argv)
    if not Path(args.app).exists():
        raise ConfigError(f"application {args.app} does not exist (relative to {Path.cwd()})")
    master = args.value("--master") or stack.spark.master
    conf = _stack_options(stack, master, connectors)
    if args.value("--driver-memory") is not None:
        conf.pop("spark.driver.memory", None)
    ours = _launch_options(conf)
    users_confs = args.confs()
    conf = {k: v for k, v in conf.items() if k not in users_confs}
    users_file = args.value("--properties-file")
    # Below a file of the user's, so that it overrides them: every one of ours.
    filed = dict(conf) if users_file else {k: v for k, v in conf.items() if is_secret(k, v)}
    ours += _conf_options({k: v for k, v in conf.items() if k not in filed})

    user: list[str] = []
    users_secrets: dict[str, str] = {}
    for name, value in args.options:
        if name in _MERGED and value:
            at = ours.index(name) + 1
            ours[at] = _MERGED[name].join(filter(None, (ours[at], value)))
        elif name == "--properties-file":
            continue
        elif name in _CONF and value and "=" in value and is_secret(*value.split("=", 1)):
            key, _, secret = value.partition("=")
            users_secrets[key] = secret
        else:
            user += [name] if value is None else [name, value]

    private: tuple[Path, ...] = ()
    if filed or users_secrets or users_file:
        text = properties_text(filed, "The stack's settings, by `flow submit`") if filed else ""
        if users_file:
            text += _users_properties(users_file)
        if users_secrets:
            text += properties_text(users_secrets, "Secret --conf settings of the command")
        private = (new_private_file(stack.home, text, ".properties"),)
        user += ["--properties-file", str(private[0])]
        if not users_file and args.value("--load-spark-defaults") is None:
            user.append("--load-spark-defaults")
    on_exit: tuple[Callable[[int], None], ...] = ()
    notes: tuple[str, ...] = ()
    java_options = "spark.driver.extraJavaOptions="
    here = args.value("--deploy-mode") != "cluster"  # the driver runs on this machine
    if stack.spark.cds and here and any(o.startswith(java_options) for o in ours):
        ours, finish = _with_class_archive(ours, stack)
        if finish is not None:
            on_exit, notes = (finish,), (MAKING_ARCHIVE,)
    head = [] if args.value("--master") else ["--master", master]
    argv_out = [spark_submit_executable(), *head, *ours, *user, args.app, *args.app_args]
    return Launch(argv_out, launch_env(master), private, on_exit, notes)


def _with_class_archive(
    options: list[str], stack: StackConfig
) -> tuple[list[str], Callable[[int], None] | None]:
    """``options`` with the driver's Java options mapping (or making) a class archive."""
    jars = options[options.index("--jars") + 1].split(",")
    java, finish = archive_options(stack.home, jars)
    key = "spark.driver.extraJavaOptions="
    return [f"{o} {java}" if o.startswith(key) else o for o in options], finish


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
