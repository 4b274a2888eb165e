"""Values that change every micro-batch, kept out of the Java code Spark generates for a plan.

Spark compiles a plan's expressions to Java (whole-stage code generation) and keeps the compiled
classes by their source text. A long or timestamp literal is written into that text, so a value
that changes every micro-batch (the batch's processing time in the Kafka parse, the late-event
threshold, the export's seed, a dead letter's ``recorded_at``) made a new source, hence new
classes, every batch: Janino compiled them and HotSpot compiled their hot methods again. On the
2-core machine the JIT compiler threads alone took 5-9 s of CPU per 50,000-impression batch of
the live stage, against 2-2.5 s for the hand-written query (per-thread CPU,
docs/experiments/2026-11-24-live-stage-rate.md).

An array literal is not written into the source: the generated code reads it from the plan's
references. :func:`held` puts a value into a one-element array literal and takes it out per row,
at an index the optimizer cannot fold (``spark_partition_id`` is not deterministic to it), so
the value never becomes a literal of its own again. (A decimal literal cast back to a long was
not enough: the optimizer pushes the cast into a guarding CASE WHEN and folds it.) The same plan
with another value then reuses the compiled classes.

A stream's batch time cannot be held that way: Spark turns ``current_timestamp()`` into the
micro-batch's timestamp (from the offset log) after the optimizer has run, so the array stays
an array of one expression, whose literal is written into the code. :func:`batch_time` reads it
inside a higher-order function instead: Spark interprets those (``CodegenFallback``), and the
generated code only calls the expression object. The price: Spark leaves the operator that
holds one out of whole-stage code generation (its expressions are still compiled, per operator),
so it belongs in a small operator of its own (spark_jobs.validate.with_time_checks). The live
stage's event-time checks compiled two new classes every batch before (the value in the code),
none now.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

__all__ = ["batch_time", "batch_value", "batch_value_sql", "held"]

_FIRST = "least(spark_partition_id(), 0) + 1"
"""1, but not foldable: the index :func:`held` takes its value out at."""


def held(value: Column) -> Column:
    """``value`` (a constant, such as a literal; not a stream's ``current_timestamp()``: see
    :func:`batch_time`) without its value in the generated code: see the module's docstring."""
    return F.element_at(F.array(value), F.expr(_FIRST))


def batch_value_sql(value: int, data_type: str = "long") -> str:
    """:func:`batch_value` as Spark SQL text, for plans built as text (one call into the JVM,
    not one per expression: a batch's plan built with the column API took 0.1-0.3 s)."""
    if not isinstance(value, int) or not data_type.isidentifier():
        raise ValueError(
            f"batch_value_sql takes an int and a type name, not {value!r}, {data_type!r}"
        )
    return f"element_at(array(CAST({value} AS {data_type})), {_FIRST})"


def batch_value(value: int, data_type: str = "long") -> Column:
    """An int that changes from one micro-batch (or query) to the next, as ``data_type``."""
    return F.expr(batch_value_sql(value, data_type))


def batch_time() -> Column:
    """``current_timestamp()`` (in a stream: the micro-batch's time, from its offset log, so a
    replayed batch has the same), without its value in the generated code: see the module's
    docstring. It costs ~0.1 us a row."""
    return F.transform(F.array(F.lit(0)), lambda _: F.current_timestamp())[0]
