"""The demo's backfill to a served model: the registered model takes raw impressions, its version
says what it was trained on and how it was judged, and ``mlflow models serve`` of it answers a
raw impression with the probability the pyfunc gives in process."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from flow.config import StackConfig
from flow.handoff import Channel
from flow.stack.model_server import model_server
from flow.stack.process import port_open
from flow.training import ModelConfig, OptimConfig, TrainConfig
from flow.workflows.loading import write_history
from flow.workflows.synthetic import SyntheticWorld
from tests.support import REPO, run_flow
from trainers.train import train

pytestmark = pytest.mark.integration

NAMESPACE = "serving"
RAW_INPUTS = [
    "user_id",
    "item_id",
    "user_country",
    "user_favorite_category",
    "item_category",
    "item_brand",
    "device",
    "item_price",
    "user_age",
    "item_rating",
    "position",
    "user_recent_items",
]


@dataclass(frozen=True)
class Registered:
    name: str
    version: str
    run_id: str
    tracking_uri: str
    handoff: str


@pytest.fixture(scope="module")
def registered(running_stack: StackConfig, stack_env: dict[str, str]) -> Registered:
    """The demo pipeline's backfill over a day of history, and a model trained on its channel,
    judged on held-out buckets and registered."""
    end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    world = SyntheticWorld(seed=8, users=800, items=200)
    write_history(running_stack, world, namespace=NAMESPACE, days=1, per_day=4000, end=end)
    argv = ["run", "pipelines/ctr_demo.py", "--namespace", NAMESPACE, "--stage", "backfill"]
    done = run_flow(argv, stack_env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]

    handoff = f"{running_stack.handoff}/{NAMESPACE}"
    name = f"ctr-serving-{uuid.uuid4().hex[:6]}"
    uri = running_stack.mlflow.tracking_uri
    config = TrainConfig(
        handoff=handoff,
        channels=("backfill",),
        model=ModelConfig("dlrm", embedding_dim=8, hidden=(32, 16), bottom=(16,)),
        optim=OptimConfig(lr=0.01),
        batch_size=256,
        device="cpu",
        log_every=10_000,
        experiment=f"test-serving-{uuid.uuid4().hex[:8]}",
        register_as=name,
        holdout_share=0.25,
        promote_margin=0.01,
    )
    result = train(config, tracking_uri=uri, say=print)
    assert result.model_version is not None
    assert result.run_id is not None
    return Registered(name, result.model_version, result.run_id, uri, handoff)


def _pyfunc(registered: Registered, ref: str) -> Any:
    mlflow.set_tracking_uri(registered.tracking_uri)
    return mlflow.pyfunc.load_model(f"models:/{registered.name}{ref}")


def test_the_registered_model_takes_raw_impressions_and_says_what_it_was_trained_on(
    registered: Registered,
) -> None:
    client = MlflowClient(tracking_uri=registered.tracking_uri)
    version = client.get_model_version(registered.name, registered.version)
    channel = Channel(registered.handoff, "backfill")
    # The version leads back to its training run, feature state, channel commits and judgement.
    assert version.tags["flow.run_id"] == registered.run_id == version.run_id
    assert version.tags["flow.feature_state"] == channel.meta().feature_state
    assert version.tags["flow.channels"] == "backfill"
    assert version.tags["flow.commits.backfill"] == "0..0"
    assert version.tags["flow.inputs"] == "raw"
    assert version.tags["flow.promotion"] == "promoted"
    assert version.tags["flow.promotion.reason"] == "no champion yet"
    champion = client.get_model_version_by_alias(registered.name, "champion")
    assert champion.version == registered.version

    model = _pyfunc(registered, "@champion")
    assert model.metadata.get_input_schema().input_names() == RAW_INPUTS
    # The input example is two of the history's impressions as the stage saw them, raw.
    example = model.input_example
    assert list(example.columns) == RAW_INPUTS
    assert set(example["device"]) <= {"ios", "android", "web"}
    assert (example["item_price"] > 0).all()
    probabilities = model.predict(example)
    assert probabilities.shape == (2,)
    assert ((probabilities > 0) & (probabilities < 1)).all()

    # Nulls are what the pipeline's features make of them (MLflow's own schema check would refuse
    # a null in a long column and an integer in a double one; the signature lets them through).
    raw = example.iloc[[0]].astype(object).assign(position=None, device=None, item_price=12)
    (scored,) = model.predict(raw)
    assert 0 < scored < 1


def test_mlflow_models_serve_answers_a_raw_impression_as_the_pyfunc_does(
    registered: Registered, tmp_path: Path
) -> None:
    model = _pyfunc(registered, "@champion")
    impression = model.input_example.iloc[[0]].astype(object).assign(position=None)
    expected = model.predict(impression)
    body = json.loads(impression.to_json(orient="split", index=False))
    uri = f"models:/{registered.name}@champion"
    with model_server(uri, tracking_uri=registered.tracking_uri, log=tmp_path / "serve.log") as url:
        answer = _post(url, {"dataframe_split": body})
        # A raw column left out is named (the caller is told to send null for an unknown value).
        partial = {"dataframe_split": {**body, "columns": body["columns"][:-1]}}
        partial["dataframe_split"]["data"] = [row[:-1] for row in body["data"]]
        with pytest.raises(urllib.error.HTTPError) as refused:
            _post(url, partial)
        message = refused.value.read().decode()
    assert refused.value.code == 400
    assert "user_recent_items" in message, message
    np.testing.assert_allclose(answer["predictions"], expected, rtol=1e-6)
    # The server and its workers are gone with the block: nothing listens on its port.
    assert not port_open("127.0.0.1", int(url.rsplit(":", 1)[1]))


def _post(url: str, payload: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{url}/invocations",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def test_the_docs_worked_example_scores_a_raw_impression(
    registered: Registered, stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/serving.md's first block, on this session's stack: the demo's namespace and model
    name swapped for the ones the fixture made."""
    text = (REPO / "docs" / "serving.md").read_text()
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    block = block.replace("models:/ctr-demo/latest", f"models:/{registered.name}/latest")
    block = block.replace('"demo.', f'"{NAMESPACE}.')
    for key, value in stack_env.items():
        monkeypatch.setenv(key, value)
    namespace: dict[str, Any] = {"__name__": "doc_block"}
    exec(compile(block, "docs/serving.md", "exec"), namespace)
    assert 0 < namespace["probability"] < 1
    assert set(namespace["frame"].columns) == set(RAW_INPUTS)
    # The enrichment found the user and the item (columns the generator never leaves null).
    found = namespace["frame"].iloc[0]
    assert found["user_favorite_category"] is not None
    assert found["item_category"] is not None
