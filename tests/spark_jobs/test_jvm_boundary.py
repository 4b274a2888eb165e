"""Spark's private API is reached from spark_jobs/jvm.py only (DESIGN.md, third wave).

Every Python file of the repository is read with ``ast``, tests and benchmarks included: a test
that reaches into py4j breaks on a Spark upgrade as surely as the code does, and test_jvm.py
tests the accessors once for all. Code held in a string (a script a test hands to spark-submit)
is read too. No exceptions are allowed: what a file needs, jvm.py gains as an accessor.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO

THE_MODULE = Path("spark_jobs", "jvm.py")

PRIVATE_ATTRIBUTES = frozenset(
    {
        # pyspark's handles on the JVM's objects
        "_jdf",  # DataFrame
        "_jsq",  # StreamingQuery
        "_jsparkSession",  # SparkSession
        "_jsc",  # SparkContext's JavaSparkContext
        "_jconf",  # SparkConf, RuntimeConfig
        "_jvm",  # SparkContext, SparkSession: py4j's view of the JVM
        "_gateway",  # SparkContext: py4j's gateway
        "_jwrite",  # DataFrameWriter, DataStreamWriter
        "_jreader",  # DataFrameReader, DataStreamReader
        "_jsqm",  # StreamingQueryManager
        "_jcatalog",  # Catalog
        "_jc",  # Column
        "_jrdd",  # RDD
        "_jseq",  # DataFrame's helper that makes a Scala Seq
        "_jmap",  # DataFrame's helper that makes a Java Map
        "_sc",  # DataFrame, SparkSession: their SparkContext
        # pyspark's private class state and hooks
        "_ensure_initialized",
        "_active_spark_context",
        "_instantiatedSession",
        "_activeSession",
        "_get_j_spark_session_class",
        "_origin",  # CapturedException's Java throwable
        "java_exception",  # Py4JJavaError's Java throwable
        # the SparkContext itself: absent in Spark Connect, and the door to the rest
        "sparkContext",
    }
)
"""Attribute names that are pyspark's JVM internals. ``_origin`` and ``java_exception`` are
what restarts are classified by (spark_jobs.jvm.exception_chain)."""

PRIVATE_MODULES = ("py4j", "pyspark.java_gateway", "pyspark.errors.exceptions.captured")
"""Modules whose import is an internal's use: py4j (Spark's transport, gone under Spark
Connect), pyspark's gateway launcher, pyspark's conversion of Java exceptions."""

_SKIPPED = {".venv", ".flow", ".git", "build", "dist", "node_modules", "__pycache__"}


def _sources(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if not _SKIPPED & set(parts) and not any(p.startswith(".") for p in parts[:-1]):
            yield path


def _private(module: str) -> bool:
    return any(module == m or module.startswith(f"{m}.") for m in PRIVATE_MODULES)


def private_uses(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, what)`` for each use of Spark's private API in ``tree``, and in code held in its
    strings (scripts run by spark-submit; at the line where the string starts)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRIBUTES:
            yield node.lineno, f".{node.attr}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"getattr", "setattr", "hasattr", "delattr"}
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in PRIVATE_ATTRIBUTES
        ):
            yield node.lineno, f"{node.func.id}(..., {node.args[1].value!r})"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _private(alias.name):
                    yield node.lineno, f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _private(node.module):
                yield node.lineno, f"from {node.module} import ..."
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            code = _as_code(node.value)
            if code is not None:
                yield from ((node.lineno, what) for _, what in private_uses(code))


def _as_code(text: str) -> ast.Module | None:
    """``text`` parsed, when it looks like a program (prose in docstrings rarely parses, and
    prose that does holds no attribute access)."""
    if "\n" not in text or "import " not in text:
        return None
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def violations(root: Path) -> list[str]:
    found = []
    for path in _sources(root):
        if path.relative_to(root) == THE_MODULE:
            continue
        tree = ast.parse(path.read_text(), str(path))
        found += [f"{path.relative_to(root)}:{line}: {what}" for line, what in private_uses(tree)]
    return found


def test_spark_internals_are_reached_only_through_spark_jobs_jvm() -> None:
    found = violations(REPO)
    assert not found, (
        "Spark's private API used outside spark_jobs/jvm.py (add an accessor there, with its "
        "test in tests/spark_jobs/test_jvm.py, and call it):\n  " + "\n  ".join(found)
    )


def test_the_scan_reads_the_whole_repository() -> None:
    scanned = {str(p.relative_to(REPO)) for p in _sources(REPO)}
    for expected in (
        "spark_jobs/live/run.py",
        "benchmarks/stages.py",
        "tests/spark_jobs/test_spark_submit.py",
        "pipelines/ctr.py",
    ):
        assert expected in scanned
    assert not [p for p in scanned if p.startswith((".venv/", ".flow/"))]


@pytest.mark.parametrize(
    ("code", "what"),
    [
        ("df._jdf.queryExecution()", "._jdf"),
        ("spark.sparkContext.defaultParallelism", ".sparkContext"),
        ("q._jsq.streamingQuery()", "._jsq"),
        ("getattr(spark, '_jvm')", "getattr(..., '_jvm')"),
        ("from py4j.protocol import Py4JJavaError", "from py4j.protocol import ..."),
        ("import py4j.java_gateway", "import py4j.java_gateway"),
        ("from pyspark.java_gateway import launch_gateway", "from pyspark.java_gateway import ..."),
        # In two pieces, so that this file's own scan does not find it.
        ('APP = """\nimport json\nconf = spark.' + 'sparkContext.getConf()\n"""', ".sparkContext"),
    ],
)
def test_each_kind_of_access_is_found(code: str, what: str) -> None:
    assert [w for _, w in private_uses(ast.parse(code))] == [what]


@pytest.mark.parametrize(
    "code",
    [
        "spark.conf.get('spark.sql.shuffle.partitions')",
        "from pyspark.errors import StreamingQueryException",
        "self._json(record)",
        '"""The SparkContext is shared; import nothing."""',
    ],
)
def test_public_api_and_lookalikes_are_not_found(code: str) -> None:
    assert list(private_uses(ast.parse(code))) == []


def test_a_new_access_elsewhere_fails_naming_its_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "spark_jobs").mkdir()
    (tmp_path / "spark_jobs" / "jvm.py").write_text("x = spark.sparkContext\n")
    (tmp_path / "spark_jobs" / "elsewhere.py").write_text("\n\nplan = df._jdf.queryExecution()\n")
    assert violations(tmp_path) == ["spark_jobs/elsewhere.py:3: ._jdf"]
