"""What made a Spark job fail, in one line, and whether trying again can help.

A failure inside a streaming query reaches the driver wrapped three or four times: the
``foreachBatch`` function's Python exception becomes py4j's ``Py4JJavaError``, Spark's
``FOREACH_BATCH_USER_FUNCTION_ERROR``, the query's ``StreamingQueryException``; an error in a
task (a shard writer's ``OSError``, Kafka's ``TimeoutException``) comes as the text of a
``SparkException``'s "most recent failure". The cause a person needs (``No space left on device``,
``Permission denied``, the broker's time-out) is the innermost of these, and its class decides
whether a restart can help: a full disk, a folder that cannot be written and a mistake in the
pipeline fail again after every restart, so they are not retried.

:func:`root_cause` finds it from the exception objects where the driver holds them (the
``foreachBatch`` writer's own exception, recorded by the stage) and from the texts Spark and
Python print where it does not (a task's traceback crosses the JVM as text). The chain's classes,
not a search of the text for phrases, classify it: :meth:`Cause.transient`.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Iterator
from dataclasses import dataclass

from spark_jobs.jvm import exception_chain

__all__ = ["Cause", "causes", "root_cause"]

# Wrappers: they say where a failure crossed a boundary, never what failed.
_WRAPPERS = frozenset(
    {
        "Py4JJavaError",
        "Py4JError",
        "CapturedException",
        "UnknownException",
        "StreamingQueryException",
        "PythonException",
        "SparkException",
        "SparkRuntimeException",
        "ExecutionException",
        "CompletionException",
        "InvocationTargetException",
        "UndeclaredThrowableException",
        "StreamFailedError",
        "QueryExecutionException",
    }
)

# The pipeline's own mistakes (flow.errors): a restart repeats them.
_PIPELINE_ERRORS = frozenset(
    {
        "ConfigError",
        "SchemaMismatchError",
        "HandoffError",
        "ShardCorruptError",
        "CommitCorruptError",
        "MissingCommitError",
        "ChannelNotFoundError",
        "LoadError",
        "SparkSetupError",
        "DependencyMissingError",
    }
)

# Errors of the storage a stage writes to that no restart mends.
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
_DENIED = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
_DENIED_CLASSES = frozenset(
    {
        "PermissionError",
        "AccessDeniedException",  # java.nio.file
        "ReadOnlyFileSystemException",
        "AccessControlException",  # Hadoop's, and java.security's
        "TopicAuthorizationException",  # Kafka: the principal may not read the topic
        "GroupAuthorizationException",
        "SaslAuthenticationException",
        "AuthenticationException",
    }
)
# Spark refusing a checkpoint's state as another query's: the query's shape changed (a pipeline
# edit, or a label join made outer: docs/pipelines.md). Its classes, and the error conditions
# that name them in a query's text (where the class is not printed).
_STATE_CHANGED = {
    "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE": "StateStoreKeySchemaNotCompatible",
    "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE": "StateStoreValueSchemaNotCompatible",
}
_STATE_CONDITION = re.compile(rf"\[({'|'.join(_STATE_CHANGED)})\]\s*(?P<message>.*)")
# Java's IOException has no errno: the operating system's message is all it keeps.
_JAVA_FULL_TEXT = ("No space left on device", "Disk quota exceeded")
_JAVA_DENIED_TEXT = ("Permission denied", "Read-only file system")

_SUFFIX = r"(?:Error|Exception|Exit|Interrupt|Failure|Throwable|Exceeded)"
# A Python traceback's last line, or Java's "Caused by: pkg.Class: message", at a line's start.
_AT_START = re.compile(
    rf"^\s*(?:Caused by: |Suppressed: )?(?P<name>(?:[A-Za-z_][\w$]*\.)*[A-Za-z_][\w$]*{_SUFFIX})"
    r"(?::[ \t]?(?P<message>.*))?$"
)
# A class inside a line: Spark's "most recent failure: Lost task ...: pkg.Class: ...", or
# "terminated with exception: Class: ..."; unqualified only between two colons.
_INSIDE = re.compile(
    rf"(?:(?<=[\s(:])(?P<name>(?:[a-z_][\w$]*\.)+[A-Z][\w$]*{_SUFFIX})(?=:|\s|$)"
    rf"|(?<=: )(?P<bare>[A-Z][\w$]*{_SUFFIX})(?=:))"
    r"(?::[ \t]?(?P<message>.*))?"
)
_ERRNO = re.compile(r"\[Errno (\d+)\]")


@dataclass(frozen=True)
class Cause:
    """One link of a failure's chain: the exception's class and its message's first line."""

    name: str
    """The class, qualified where the source says so (``java.io.IOException``, ``OSError``)."""
    message: str
    errno: int | None = None
    """The operating system's error number, where the exception carries one."""

    @property
    def short_name(self) -> str:
        return self.name.rsplit(".", 1)[-1]

    @property
    def kind(self) -> str:
        """``disk full``, ``permission denied``, ``pipeline error``, ``checkpoint of another
        query``, or ``transient``."""
        if self.errno in _FULL or (
            self.short_name.endswith(("IOException", "FileSystemException"))
            and any(text in self.message for text in _JAVA_FULL_TEXT)
        ):
            return "disk full"
        if (
            self.errno in _DENIED
            or self.short_name in _DENIED_CLASSES
            or (
                self.short_name.endswith(("IOException", "FileSystemException"))
                and any(text in self.message for text in _JAVA_DENIED_TEXT)
            )
        ):
            return "permission denied"
        if self.short_name in _PIPELINE_ERRORS:
            return "pipeline error"
        if self.short_name in _STATE_CHANGED.values():
            return "checkpoint of another query"
        return "transient"

    @property
    def transient(self) -> bool:
        """Whether starting again may help: a broker away, a task lost, a time-out may pass; a
        full disk, a refused write and a mistake in the pipeline are there after any restart."""
        return self.kind == "transient"

    @property
    def wrapper(self) -> bool:
        return self.short_name in _WRAPPERS

    @property
    def remedy(self) -> str:
        """What to change, for a cause no restart mends ('' for a transient one)."""
        return {
            "disk full": "free space where the stage writes (handoff, checkpoints, lake) or "
            "point it at a larger volume",
            "permission denied": "give this user write access there, or point the stage at a "
            "location it may write",
            "pipeline error": "correct the pipeline or its data layout as the error says",
            "checkpoint of another query": "the stage's checkpoint holds the state of a query "
            "of another shape (its pipeline changed, or it was made before 2026-11-28, when a "
            "label join became an outer join) and Spark cannot resume it: undo the change, or "
            "start the stage on a new checkpoint (docs/pipelines.md, 'A checkpoint of another "
            "query')",
        }.get(self.kind, "")

    def __str__(self) -> str:
        return f"{self.name}: {self.message}" if self.message else self.name


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return (lines[0] if lines else "")[:400]


def _of_text(text: str) -> Iterator[Cause]:
    """Every ``Class: message`` line of a printed exception (Java's ``Caused by:`` chains and
    Python's tracebacks, a task's traceback inside a Java message included), in text order."""
    for line in text.splitlines():
        changed = _STATE_CONDITION.search(line)
        if changed is not None:
            yield Cause(_STATE_CHANGED[changed.group(1)], changed["message"].strip()[:400])
        found = [m for m in [_AT_START.match(line)] if m is not None]
        start = found[0].end("name") if found else 0
        found += [m for m in _INSIDE.finditer(line) if m.start() >= start]
        for match in found:
            message = (match["message"] or "").strip()[:400]
            number = _ERRNO.search(message)
            name = match["name"] or match.groupdict().get("bare") or ""
            yield Cause(name, message, int(number.group(1)) if number else None)


def _of_exception(error: BaseException) -> Iterator[Cause]:
    """The chain of ``error``, outermost first, by class (spark_jobs.jvm.exception_chain: its
    Python causes, the Java throwables behind them, the exceptions a traceback that crossed the
    JVM as text ends with); a message of many lines is searched for the causes it carries."""
    for name, message in exception_chain(error):
        number = _ERRNO.search(message)
        yield Cause(name, _first_line(message), int(number.group(1)) if number else None)
        if "\n" in message.strip():
            yield from _of_text(message)


def causes(error: BaseException | str) -> list[Cause]:
    """Every link found in ``error`` (an exception, or the text a query's ``exception()`` gives)."""
    return list(_of_text(error) if isinstance(error, str) else _of_exception(error))


def root_cause(*errors: BaseException | str | None) -> Cause | None:
    """The cause to name and to classify, from the most precise of ``errors`` first.

    A link that no restart mends (:attr:`Cause.transient` false) wins wherever it is in the
    chain: it is why the rest failed. Otherwise the last link that is not a wrapper (the
    innermost of a Java ``Caused by:`` chain; a task's own error inside Spark's message).
    """
    found: list[Cause] = []
    for error in errors:
        if error is not None:
            found += causes(error)
    meaningful = [c for c in found if not c.wrapper]
    for cause in meaningful:
        if not cause.transient:
            return cause
    if meaningful:
        return meaningful[-1]
    return found[0] if found else None
