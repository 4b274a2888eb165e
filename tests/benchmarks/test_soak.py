"""flow bench soak, short (benchmarks/soak.py): the live stage for ten micro-batches with a
stream and a follower, checked for what holds whatever the timing.

No figure is timed here: a shared 2-core machine makes any timed assertion flaky. Ten (the
fewest the soak takes: it compares the first and last tenth), not the hundred a soak wants: a
micro-batch of the CTR stage costs 1.5-8 s on two cores (its fixed cost: planning, the join's
state, the writers, the ledger's commit), so a hundred would take minutes to a quarter of an
hour. The long run and its figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import importlib
import io
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from pyspark.sql import SparkSession
from rich.console import Console

from flow.config import StackConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PER_BATCH = (
    "duration_ms", "ms_addBatch", "rows_in", "heap_used", "non_heap_used", "jvm_rss",
    "python_rss", "log_bytes", "log_files", "records", "segments", "shards_bytes",
    "spark_checkpoint_bytes", "ledger_metadata_bytes",
)  # fmt: skip


@pytest.fixture
def soak(benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark("soak")


def test_a_short_soak_delivers_each_impression_once_and_compacts_the_log(
    spark: SparkSession, running_stack: StackConfig, soak: ModuleType, tmp_path: Path
) -> None:
    config = soak.SoakConfig(
        batches=10,
        rate=20.0,
        trigger="0.5 seconds",
        gc_every=3,
        buckets=4,
        history_per_day=1000,
        namespace=f"soak_{uuid.uuid4().hex[:6]}",
    )
    result = soak.report(soak.soak(spark, running_stack, config, print), config)
    failed = {name: c["detail"] for name, c in result["checks"].items() if not c["ok"]}
    assert not failed, failed
    assert set(result["checks"]) == {
        "every impression once",
        "positives at most once, after their impression",
        "counts reconcile",
        "log compacted",
    }
    # Every micro-batch while the stream ran is a sample with every figure.
    samples = result["batches"]
    assert len(samples) >= config.batches
    for sample in samples[: config.batches]:  # while the stream ran (then: catching up)
        missing = [k for k in PER_BATCH if sample.get(k) is None]
        assert not missing, (sample["index"], missing)
    collected = [s for s in samples if s["heap_after_gc"] is not None]
    assert len(collected) >= config.batches // config.collect_every
    assert any(s["idle_poll_s"] is not None for s in samples)
    assert result["follower"]["idle_looks"] > 0
    summary = result["summary"]
    assert set(summary["measures"]) == set(importlib.import_module("_soak_report").MEASURES)
    assert summary["measures"]["batch_ms"]["first"] > 0
    assert summary["targets"]["idle_poll_requests"]["met"]  # requests are counted, not timed
    assert result["stage"]["writer"] == "inplan"  # the path flow demo takes
    json.dumps(result)
    text = io.StringIO()
    soak.show(result, Console(file=text, width=200))
    assert "check log compacted: ok" in text.getvalue()
    assert soak.plot(result, tmp_path / "soak.png").exists()
