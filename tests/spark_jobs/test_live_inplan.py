"""The writes inside a live stage's streaming plan: which stages take that path, and what the
writer tasks do with their rows (pure Arrow; the path end to end is in test_stages.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from flow.pipeline.model import HandoffOutput, LiveStage, TableOutput
from pipelines.ctr_demo import ctr_demo
from pipelines.ctr_streaming import ctr_streaming
from spark_jobs.handoff import BUCKET, SHARDS_ARROW
from spark_jobs.live.inplan import DEAD_RAW, DEAD_REASON, OUT_SCHEMA, unsupported, writer_tasks
from spark_jobs.live.run import IN_PLAN, choose_writer


def _eligibility(
    strategy: Literal["window", "immediate"] = "window",
    output: HandoffOutput | TableOutput | None = None,
) -> str | None:
    pipeline = ctr_streaming(label_strategy=strategy)
    if output is not None:
        pipeline = replace(pipeline, output=output)
    stage = pipeline.stage("live", LiveStage)
    return unsupported(pipeline, stage, pipeline.sources[stage.events])  # type: ignore[arg-type]


def test_the_ctr_live_stage_writes_inside_its_plan() -> None:
    assert _eligibility() is None


def test_immediate_labels_write_inside_the_plan_too() -> None:
    assert _eligibility("immediate") is None


def test_the_default_pipeline_runs_the_in_plan_writer() -> None:
    """The demo's pipeline (`flow demo`, the docs' first example): immediate labels into the
    handoff, written by the in-plan writer, and said so."""
    pipeline = ctr_demo()
    stage = pipeline.stage("live", LiveStage)
    assert stage.label is not None
    assert stage.label.strategy == "immediate"
    assert isinstance(pipeline.output, HandoffOutput)
    events = pipeline.sources[stage.events]
    assert choose_writer(pipeline, stage, events) == ("inplan", IN_PLAN)  # type: ignore[arg-type]


def test_a_stage_left_to_the_stream_writer_is_told_why() -> None:
    pipeline = replace(ctr_demo(), output=TableOutput())
    stage = pipeline.stage("live", LiveStage)
    kind, why = choose_writer(pipeline, stage, pipeline.sources[stage.events])  # type: ignore[arg-type]
    assert kind == "stream"
    assert "Iceberg table" in why


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"output": TableOutput()}, "Iceberg table"),
        ({"output": HandoffOutput(shuffle_key="impression_id")}, "shuffle_key"),
    ],
)
def test_stages_the_plan_cannot_hold_say_why(change: dict[str, Any], said: str) -> None:
    why = _eligibility(**change)
    assert why is not None
    assert said in why


def _rows(reasons: list[str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "label": pa.array([1.0] * len(reasons), pa.float32()),
            BUCKET: pa.array(list(range(len(reasons))), pa.int32()),
            DEAD_RAW: pa.array([f"row{i}".encode() if r else None for i, r in enumerate(reasons)]),
            DEAD_REASON: pa.array(reasons, pa.string()),
        }
    )


class _Shards:
    """Stands in for the handoff's shard writer: records what it was given, yields one shard."""

    def __init__(self) -> None:
        self.given: dict[int, list[pa.RecordBatch]] = {}

    def __call__(
        self, batch_id: int
    ) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
        def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            self.given[batch_id] = list(batches)
            rows = sum(b.num_rows for b in self.given[batch_id])
            yield pa.RecordBatch.from_pylist(
                [{"path": f"b{batch_id}.arrow", "bucket": 0, "rows": rows}],
                schema=pa.schema(list(SHARDS_ARROW)),
            )

        return write


def test_rows_that_cannot_train_come_back_as_dead_letters_the_others_as_shards() -> None:
    shards = _Shards()
    task = writer_tasks(shards, written_upto=-1, batch_of=lambda: 3)
    out = pa.Table.from_batches(list(task([_rows(["", "label is null", ""]), _rows([""])])))
    assert out.schema == OUT_SCHEMA
    kinds = out.column("_kind").to_pylist()
    assert sorted(kinds) == ["shard", "unusable"]
    shard = out.filter(pc.equal(out.column("_kind"), "shard")).to_pylist()[0]
    assert shard["rows"] == 3
    assert shard["path"] == "b3.arrow"
    dead = out.filter(pc.equal(out.column("_kind"), "unusable")).to_pylist()[0]
    assert dead["raw"] == b"row1"
    assert dead["reason"] == "label is null"
    written = pa.Table.from_batches(shards.given[3])
    assert DEAD_RAW not in written.column_names
    assert DEAD_REASON not in written.column_names
    assert written.num_rows == 3


def test_a_batch_the_channel_has_writes_no_shards_but_still_returns_its_dead_letters() -> None:
    shards = _Shards()
    task = writer_tasks(shards, written_upto=3, batch_of=lambda: 3)
    out = pa.Table.from_batches(list(task([_rows(["", "weight is 0"])])), schema=OUT_SCHEMA)
    assert out.column("_kind").to_pylist() == ["unusable"]
    assert shards.given == {}


def test_a_task_not_told_its_batch_fails_rather_than_write_it_as_another() -> None:
    task = writer_tasks(_Shards(), written_upto=-1, batch_of=lambda: -1)
    with pytest.raises(RuntimeError, match="batch"):
        list(task([_rows([""])]))
