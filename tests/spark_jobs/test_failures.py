"""A failure's cause in one line, found through Spark's and py4j's wrappers, and classified by
its class: what a restart can mend and what it cannot."""

from __future__ import annotations

import errno

import pytest

from spark_jobs.failures import Cause, causes, root_cause

FOREACH_BATCH = """[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided \
function in foreach batch sink. Reason: An exception was raised by the Python Proxy. Return \
Message: Traceback (most recent call last):
  File "/x/py4j/clientserver.py", line 644, in _call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
  File "/x/spark_jobs/live/inplan.py", line 371, in __call__
    self._channel.commit(batch_id, written)
  File "/x/flow/handoff/channel.py", line 211, in add_commit
    with open(path, "wb") as out:
PermissionError: [Errno 13] Permission denied: '/data/handoff/ctr/live/commits/00000012.json'
"""

TASK_DISK_FULL = """An error occurred while calling o812.collect.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 44.0 \
failed 1 times, most recent failure: Lost task 1.0 in stage 44.0 (TID 90) (127.0.0.1 executor \
driver): org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/x/spark_jobs/handoff.py", line 120, in write
    sink.write(batch)
OSError: [Errno 28] No space left on device

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(x.scala:1)
"""

KAFKA_TIMEOUT = """[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: Job \
aborted due to stage failure: Task 0 in stage 3.0 failed 1 times, most recent failure: Lost \
task 0.0 in stage 3.0 (TID 3) (127.0.0.1 executor driver): \
org.apache.kafka.common.errors.TimeoutException: Timeout of 60000ms expired before the position \
for partition ctr.impressions-0 could be determined
\tat org.apache.spark.sql.kafka010.KafkaDataConsumer.get(KafkaDataConsumer.scala:1)
Caused by: org.apache.spark.SparkException: wrapped again
"""


def test_a_refused_write_in_the_batch_function_is_named_and_not_retried() -> None:
    cause = root_cause(FOREACH_BATCH)
    assert cause is not None
    assert cause.kind == "permission denied"
    assert not cause.transient
    assert str(cause) == (
        "PermissionError: [Errno 13] Permission denied: "
        "'/data/handoff/ctr/live/commits/00000012.json'"
    )


def test_a_full_disk_in_a_task_is_found_inside_sparks_message() -> None:
    cause = root_cause(TASK_DISK_FULL)
    assert cause == Cause("OSError", "[Errno 28] No space left on device", errno.ENOSPC)
    assert cause.kind == "disk full"
    assert not cause.transient


def test_a_broker_time_out_is_the_innermost_cause_and_transient() -> None:
    cause = root_cause(KAFKA_TIMEOUT)
    assert cause is not None
    assert cause.name == "org.apache.kafka.common.errors.TimeoutException"
    assert cause.message.startswith("Timeout of 60000ms expired")
    assert cause.transient


def test_the_exception_object_is_read_before_its_text() -> None:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/h/shard-3.arrow")
        except OSError as exc:
            raise RuntimeError("the export failed") from exc
    except RuntimeError as outer:
        error = outer
    cause = root_cause(error, "terminated with exception: something vaguer")
    assert cause is not None
    assert (cause.name, cause.errno, cause.kind) == ("OSError", errno.ENOSPC, "disk full")
    assert "/h/shard-3.arrow" in str(cause)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("java.io.IOException: No space left on device", "disk full"),
        ("Caused by: java.nio.file.AccessDeniedException: /data/ckpt/offsets", "permission denied"),
        ("org.apache.kafka.common.errors.TopicAuthorizationException: ctr", "permission denied"),
        ("flow.errors.ConfigError: column 'price' is missing", "pipeline error"),
        ("SchemaMismatchError: channel 'live' has another schema", "pipeline error"),
        ("java.net.ConnectException: Connection refused", "transient"),
    ],
)
def test_each_kind_by_its_class(text: str, kind: str) -> None:
    cause = root_cause(f"terminated with exception: {text}")
    assert cause is not None
    assert cause.kind == kind


def test_a_mention_in_a_stack_frame_is_not_a_cause() -> None:
    frames = "\tat org.apache.spark.SparkException.<init>(SparkException.scala:1)\n"
    assert causes(frames) == []


def test_nothing_found_is_none_and_wrappers_alone_are_named() -> None:
    assert root_cause("no exception here") is None
    only = root_cause("org.apache.spark.SparkException: Job aborted")
    assert only is not None
    assert only.short_name == "SparkException"


STATE_CHANGED = """[STREAM_FAILED] Query [id = e2b7, runId = f4d5] terminated with exception: \
[STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE] Provided value schema does not match existing state \
value schema.
Please check number and type of fields.
\tat org.apache.spark.sql.execution.streaming.state.StateStoreErrors$.x(StateStoreErrors.scala:158)
"""


def test_a_checkpoint_of_another_query_is_named_and_not_restarted() -> None:
    # What Spark 4.1 says when a stage resumes a checkpoint whose join was of another type
    # (tests/spark_jobs/test_join_resume.py): the class is not in the text, the condition is.
    cause = root_cause(STATE_CHANGED)
    assert cause is not None
    assert cause.short_name == "StateStoreValueSchemaNotCompatible"
    assert cause.kind == "checkpoint of another query"
    assert not cause.transient
    assert "new checkpoint" in cause.remedy
