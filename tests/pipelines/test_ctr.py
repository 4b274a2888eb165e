"""The example CTR pipelines end to end: generated data -> flow run -> training rows a model
can learn from, dead letters for every malformed record, counts that reconcile, MLflow runs."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest
import torch
from mlflow.tracking import MlflowClient

from flow.config import StackConfig
from flow.pipeline.state import FeatureState, layout, states_location
from flow.stack.iceberg import open_catalog
from flow.workflows.loading import produce_stream, write_history
from flow.workflows.synthetic import SyntheticWorld
from pipelines.ctr import ctr_features
from tests.support import auc, handoff_rows, run_flow

pytestmark = pytest.mark.integration


def logistic_auc(
    sparse: np.ndarray, dense: np.ndarray, labels: np.ndarray, sizes: list[int]
) -> float:
    """A logistic model over one weight per categorical index plus the dense block."""
    torch.manual_seed(0)
    cut = int(len(labels) * 0.8)
    offsets = torch.tensor(np.cumsum([0, *sizes[:-1]]))
    index = torch.tensor(sparse, dtype=torch.long) + offsets
    weights = torch.nn.Embedding(sum(sizes), 1)
    torch.nn.init.zeros_(weights.weight)
    linear = torch.nn.Linear(dense.shape[1], 1)
    x_dense = torch.tensor(dense)
    y = torch.tensor(labels, dtype=torch.float32)
    optimizer = torch.optim.Adam([*weights.parameters(), *linear.parameters()], lr=0.05)
    for _ in range(60):
        optimizer.zero_grad()
        logits = weights(index[:cut]).sum(dim=(1, 2)) + linear(x_dense[:cut]).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y[:cut])
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    with torch.no_grad():
        held_out = weights(index[cut:]).sum(dim=(1, 2)) + linear(x_dense[cut:]).squeeze(1)
    return auc(held_out.numpy(), labels[cut:].astype(bool))


def test_backfill_then_streaming_produce_learnable_reconciled_rows(
    running_stack: StackConfig, stack_env: dict[str, str]
) -> None:
    # Event times relative to now: the live source dead-letters events more than 30 days
    # before the processing time (KafkaSource.max_past) or 10 minutes after it (max_future).
    # The stream ends 2 hours ago, so that its latest clicks (late ones come up to 90 minutes
    # after their impression) are in the past too.
    base = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=5)
    history = write_history(
        running_stack,
        SyntheticWorld(seed=21, users=3000, items=600),
        days=2,
        per_day=10_000,
        end=base,
    )
    backfill = run_flow(["run", "pipelines/ctr_backfill.py"], stack_env)
    output = backfill.stdout + backfill.stderr
    assert backfill.returncode == 0, output[-4000:]
    # The run id `flow insight RUN_ID` takes, and a link that opens the runs view.
    printed = re.search(r"MLflow run ([0-9a-f]{32}): http\S+workflowType=machine_learning", output)
    assert printed, output[-3000:]

    catalog = open_catalog(running_stack.catalog)
    handoff = f"{running_stack.handoff}/ctr"
    rows = handoff_rows(handoff, "backfill").sort_by("ts")
    assert len(rows) == history.impressions  # the generator's history is all valid
    assert pc.sum(rows.column("label")).as_py() == history.clicks - history.late_clicks
    state = FeatureState.load(states_location(running_stack, "ctr"), ctr_features())
    sizes = [cardinality for _, cardinality in layout(ctr_features(), state).sparse]
    # The feature blocks are fixed-size lists: one buffer each, reshaped without copying rows.
    sparse = rows.column("sparse").combine_chunks().flatten().to_numpy().reshape(len(rows), -1)
    dense = rows.column("dense").combine_chunks().flatten().to_numpy().reshape(len(rows), -1)
    learned = logistic_auc(sparse, dense, rows.column("label").to_numpy() > 0.5, sizes)
    assert learned > 0.6, f"a model on the training rows reached only AUC {learned:.3f}"

    # One transform, two executions: the Python transform of the rows' raw inputs (the tables
    # at the commit's snapshots) gives what Spark committed, every feature of every row.
    check = run_flow(["check", "consistency", "ctr", "backfill", "--rows", "5000"], stack_env)
    assert check.returncode == 0, (check.stdout + check.stderr)[-4000:]
    assert "5,000 rows, 16 features: 0 mismatches" in check.stdout, check.stdout

    stream = produce_stream(
        running_stack,
        count=3000,
        malformed_share=0.03,
        start=base + timedelta(hours=1),
        span=timedelta(minutes=120),
        seed=5,
    )
    streaming = run_flow(["run", "pipelines/ctr_streaming.py"], stack_env)
    output = streaming.stdout + streaming.stderr
    assert streaming.returncode == 0, output[-4000:]
    assert "do NOT reconcile" not in output

    dead = catalog.load_table("ctr.dead_letters").scan(row_filter="stage == 'live'").to_arrow()
    assert len(dead) == sum(stream.malformed.values())
    live_rows = handoff_rows(handoff, "live")
    ids = live_rows.column("impression_id").to_pylist()
    assert len(ids) == len(set(ids))
    # Impressions in the last 40 minutes (30-minute window + 10-minute watermark) may still wait.
    assert stream.valid_impressions * 0.5 < len(live_rows) <= stream.valid_impressions
    # The join's state is in RocksDB (LiveStage.state_store), as the query's offset log says.
    offsets = Path(
        running_stack.checkpoints, "ctr", "ctr_streaming", "live", "stream", "offsets", "0"
    )
    assert "RocksDBStateStoreProvider" in offsets.read_text()

    client = MlflowClient(tracking_uri=running_stack.mlflow.tracking_uri)
    experiment = client.get_experiment_by_name("pipeline-ctr_backfill")
    assert experiment is not None
    # This run's stage, nested under the pipeline run it printed: the experiment is the
    # session's, and other tests (docs/production.md's example) run namespace ctr's pipelines too.
    runs = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{printed.group(1)}'",
    )
    (stage,) = [r for r in runs if r.info.run_name == "backfill"]
    assert stage.data.metrics["rows_in"] == history.impressions
    assert stage.data.metrics["reconciled"] == 1.0
    assert stage.data.tags["flow.feature_state"] == state.version
    artifacts = {a.path for a in client.list_artifacts(stage.info.run_id)}
    assert {"layout.json", "feature_state"} <= artifacts
