"""Baseline readers for the handoff benchmark, each in its own venv, run in a subprocess.

    .venv/bin/python benchmarks/baselines/envs.py setup petastorm     # build the venv (once)
    .venv/bin/python benchmarks/baselines/envs.py run ray --parquet DIR [--shuffle] [--no-stack]

From the handoff benchmark (``benchmarks/`` is a plain folder, run as scripts)::

    sys.path.insert(0, str(Path(__file__).parent))
    from baselines.envs import ensure_env, run_baseline

    result = run_baseline("petastorm", home, parquet_dir, shuffle=True)

Why separate venvs: Petastorm 0.13.1 needs pyarrow 14 / numpy < 2 while the project pins
pyarrow 25, and Ray brings its own pyarrow and a cluster runtime. Each baseline gets
``<home>/bench-envs/<name>``, built once from ``requirements-<name>.txt`` after the CPU torch wheel
(``../shared/wheels/torch-*.whl`` beside the checkout, as the Makefile uses), and rebuilt when the
requirements file, the wheel or the Python version change (a stamp file holds their hash).

The Parquet the baselines read: a folder of ``*.parquet`` files (nothing else in it, no
partition folders), all with the same schema of flat scalar columns, which is what both
libraries read fastest:

* ``label`` float32; ``d0`` .. ``d12`` float32 (dense); ``c0`` .. ``c25`` int64 (categorical);
* several files (8-16) of about 64k-row row groups, so both readers have units to spread over
  their workers (``sample_parquet.py`` writes this layout; Spark's default write fits too).

Each script (``petastorm_read.py``, ``ray_read.py``) reads it once and prints one JSON line:
``rows``, ``seconds``, ``rows_per_s`` (after warm-up), ``first_batch_s`` (reader creation to
first batch), ``peak_rss_mb`` (the reading process), ``peak_tree_pss_mb`` (with its child
processes), ``total_rows``, ``batches`` and ``settings``; ``readloop.py`` says exactly what is
timed. This module needs only the standard library and filelock (a project dependency), so the
project venv imports it as is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from filelock import FileLock

__all__ = ["BASELINES", "BaselineError", "ensure_env", "run_baseline", "torch_wheel"]

HERE = Path(__file__).resolve().parent
BENCHMARKS = HERE.parent
PROJECT_ROOT = BENCHMARKS.parent
WHEELS = PROJECT_ROOT.parent / "shared" / "wheels"

# name -> the module its venv runs (python -m baselines.<module>)
BASELINES = {"petastorm": "petastorm_read", "ray": "ray_read"}

# Opt-in for machines with no CPU wheel: PyPI's Linux torch is the CUDA build, several GB.
TORCH_FROM_PYPI_ENV = "FLOW_BENCH_TORCH_FROM_PYPI"
STAMP = ".flow-bench-stamp"
STDERR_TAIL = 4000


class BaselineError(RuntimeError):
    """A baseline venv could not be built, or its script failed or printed no result."""


def torch_wheel() -> Path | None:
    """The CPU torch wheel beside the checkout (newest name first), or None."""
    wheels = sorted(WHEELS.glob("torch-*.whl"), reverse=True)
    return wheels[0] if wheels else None


def ensure_env(name: str, home: Path) -> Path:
    """Build ``home/bench-envs/<name>`` if it is missing or stale; return its python.

    Safe to call from two processes at once: the second waits on a lock file and then finds the
    venv ready.
    """
    requirements = _requirements(name)
    wheel = _torch_source()
    venv = home / "bench-envs" / name
    python = venv / "bin" / "python"
    stamp = _stamp(requirements, wheel)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(venv.parent / f"{name}.lock"):
        if _read(venv / STAMP) == stamp and python.exists():
            return python
        log = venv.parent / f"{name}.log"
        log.write_text("")
        _step(f"creating venv {venv}", [sys.executable, "-m", "venv", "--clear", str(venv)], log)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        _step("upgrading pip", [*pip, "--upgrade", "pip"], log)
        torch_target = str(wheel) if wheel is not None else "torch"
        _step(f"installing torch from {torch_target} (a few minutes)", [*pip, torch_target], log)
        _step(f"installing {requirements.name}", [*pip, "-r", str(requirements)], log)
        (venv / STAMP).write_text(stamp)
    return python


def run_baseline(
    name: str,
    home: Path,
    parquet_dir: Path,
    *,
    shuffle: bool,
    batch_size: int = 4096,
    stack: bool = True,
    warmup_batches: int = 20,
    extra_args: Sequence[str] = (),
    timeout: float = 900,
) -> dict[str, Any]:
    """Read ``parquet_dir`` once with baseline ``name`` in its venv; return its JSON result.

    ``extra_args`` go to the script as they are (e.g. ``["--pool", "process"]`` for Petastorm,
    ``["--object-store-gb", "4"]`` for Ray; see each script's ``--help``).
    """
    if not any(Path(parquet_dir).glob("*.parquet")):
        raise BaselineError(
            f"no *.parquet files in {parquet_dir}: write the layout this module's docstring "
            "describes there first (sample_parquet.py writes one)"
        )
    python = ensure_env(name, home)
    command = [
        str(python),
        "-m",
        f"baselines.{BASELINES[name]}",
        "--parquet",
        str(Path(parquet_dir).resolve()),
        "--batch-size",
        str(batch_size),
        "--shuffle" if shuffle else "--no-shuffle",
        "--stack" if stack else "--no-stack",
        "--warmup-batches",
        str(warmup_batches),
        *extra_args,
    ]
    stdout, stderr, code = _run(command, timeout, name)
    if code != 0:
        raise BaselineError(
            f"baseline {name!r} (venv {python.parent.parent}) exited with {code}\n"
            f"command: {' '.join(command)}\nstderr (tail):\n{stderr[-STDERR_TAIL:]}"
        )
    result = _result_line(stdout)
    if result is None:
        raise BaselineError(
            f"baseline {name!r} printed no JSON result line\ncommand: {' '.join(command)}\n"
            f"stdout (tail):\n{stdout[-STDERR_TAIL:]}\nstderr (tail):\n{stderr[-STDERR_TAIL:]}"
        )
    result["baseline"] = name
    return result


def _requirements(name: str) -> Path:
    if name not in BASELINES:
        raise ValueError(f"unknown baseline {name!r}: choose one of {', '.join(BASELINES)}")
    return HERE / f"requirements-{name}.txt"


def _torch_source() -> Path | None:
    """The wheel to install torch from; None means PyPI, allowed only where that is sane."""
    wheel = torch_wheel()
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    if wheel is not None:
        if f"-{tag}-" not in wheel.name:
            raise BaselineError(
                f"{wheel.name} does not fit this Python ({tag}): run the benchmark from the "
                "project venv on the Python the wheel was built for (see the Makefile)"
            )
        return wheel
    if sys.platform == "linux" and os.environ.get(TORCH_FROM_PYPI_ENV) != "1":
        raise BaselineError(
            f"no CPU torch wheel in {WHEELS} (torch-*.whl), and PyPI's Linux torch is the "
            "CUDA build (several GB): put the CPU wheel there, as the Makefile expects, or set "
            f"{TORCH_FROM_PYPI_ENV}=1 to install PyPI's build anyway"
        )
    return None


def _stamp(requirements: Path, wheel: Path | None) -> str:
    digest = hashlib.sha256(requirements.read_bytes())
    digest.update(f"\n{wheel.name if wheel else 'pypi'}\n{sys.version}".encode())
    return digest.hexdigest()


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _step(message: str, command: list[str], log: Path) -> None:
    """Run one slow set-up command, its output appended to ``log``; say what failed, with why."""
    print(f"[bench-envs] {message}", file=sys.stderr, flush=True)
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        code = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT)
    if code != 0:
        tail = log.read_text()[-STDERR_TAIL:]
        raise BaselineError(
            f"{message} failed (exit {code})\ncommand: {' '.join(command)}\n"
            f"output (tail, full log in {log}):\n{tail}"
        )


def _clean_env() -> dict[str, str]:
    """The baseline must see its own venv only: no inherited PYTHONPATH or VIRTUAL_ENV, and
    ``benchmarks/`` on the path for ``baselines.*`` (never the project root, so ``flow`` is out
    of reach)."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME"}}
    env.pop("VIRTUAL_ENV", None)
    env["PYTHONPATH"] = str(BENCHMARKS)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    return env


def _run(command: list[str], timeout: float, name: str) -> tuple[str, str, int]:
    """Run in a new session so a time-out also ends the reader's children (Ray's raylet and
    workers, Petastorm's process pool)."""
    process = subprocess.Popen(
        command,
        cwd=BENCHMARKS,
        env=_clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate()
        raise BaselineError(
            f"baseline {name!r} ran past {timeout:.0f}s and was killed: raise timeout= or read "
            f"less data\ncommand: {' '.join(command)}\nstderr (tail):\n{stderr[-STDERR_TAIL:]}"
        ) from None
    return stdout, stderr, process.returncode


def _result_line(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                parsed = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(parsed, dict) and "rows_per_s" in parsed:
                return parsed
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["setup", "run"])
    parser.add_argument("name", choices=sorted(BASELINES))
    parser.add_argument("--home", type=Path, default=Path(os.environ.get("FLOW_HOME", ".flow")))
    parser.add_argument("--parquet", type=Path, help="for run: the folder of .parquet files")
    parser.add_argument("--shuffle", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--stack", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--batch-size", type=int, default=4096)
    args, extra = parser.parse_known_args()
    home = args.home.expanduser().resolve()
    if args.action == "setup":
        print(ensure_env(args.name, home))
        return
    if args.parquet is None:
        parser.error("run needs --parquet DIR")
    result = run_baseline(
        args.name,
        home,
        args.parquet,
        shuffle=args.shuffle,
        stack=args.stack,
        batch_size=args.batch_size,
        extra_args=extra,
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
