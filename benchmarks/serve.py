"""Serving latency of the raw-input model per request, in process and over HTTP.

Requests of 1 and 100 raw impressions, through the pyfunc in process and over HTTP through
``mlflow models serve``.

    flow bench serve                                    # the demo's model, built here
    flow bench serve --requests 300 --no-http           # in process only, a quick look
    flow bench serve --model models:/ctr-demo/latest    # a CTR model of the stack's registry

What it builds (no Spark, no services): the CTR pipeline's feature spec (``pipelines/ctr.py``)
with a state fitted here, in numpy, on generated impressions joined with their users and items
as the backfill's enrichment joins them (vocabularies by frequency, moments, quantile cut
points: the shape of Spark's fit, not its exact values); the demo's model (``dlrm``, default
sizes) with its initial weights, which latency does not depend on; logged by
``trainers.serving.log_model`` as the raw-input pyfunc to a temporary MLflow store (SQLite).

Per request, the rows are the next ones of the generated impressions (no two requests alike):

* ``in-process``: ``mlflow.pyfunc.load_model(uri).predict(frame)``: MLflow's schema check, the
  feature transform (flow.transform), the model; the frame is made before the clock starts;
* ``http``: ``mlflow models serve`` of the model (local environment, one worker) on 127.0.0.1, a
  POST of the rows as ``dataframe_split`` JSON over a kept-alive connection (the JSON made
  before the clock starts), until the answer is read.

p50 and p99 of each after ``--warmup`` requests, and in process also of the CPU time the request
took (this thread's: what it costs on a core of its own; on a shared machine the wall time's tail
is mostly waiting for one), with the load average; ``--profile`` prints where in-process time goes.
Results print and go to $FLOW_HOME/bench/serve-<time>.json. Targets (issue 44): in process, p99
under 5 ms for 1 row and under 20 ms for 100 rows.
"""

from __future__ import annotations

import argparse
import cProfile
import http.client
import json
import os
import pstats
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from _results import save

from flow.config import StackConfig
from flow.pipeline.features import Bucketized, FeatureSpec, Numeric, Vocabulary, feature_name
from flow.pipeline.state import FeatureState, layout
from flow.stack.model_server import model_server
from flow.training import ModelConfig
from flow.transform.serving import ServingFeatures
from flow.workflows.synthetic import SyntheticWorld, simulate
from pipelines.ctr import ctr_features
from pipelines.ctr_backfill import ctr_backfill

NEEDS_SERVICES = False
NEEDS_SPARK = False
SIZES = (1, 100)


def raw_impressions(count: int, seed: int = 0) -> pa.Table:
    """Generated impressions with their users' and items' columns, prefixed as the CTR
    pipeline's enrichment names them (``user_country``, ``item_price``, ...)."""
    world = SyntheticWorld(seed=seed, users=20_000, items=4_000, drift=0.0, new_items=0.0)
    users, items = world.users_table(), world.items_table()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    shown = simulate(
        users, items, count=count, start=start, span=timedelta(days=1), seed=seed, world=world
    ).impressions
    # The tables' ids are their row numbers: the enrichment's join is a take.
    joined = shown
    for table, key, prefix in ((users, "user_id", "user_"), (items, "item_id", "item_")):
        found = table.take(shown.column(key))
        for name in found.column_names:
            if name != key:
                joined = joined.append_column(prefix + name, found.column(name))
    return joined


def _transformed(feature: Numeric | Bucketized, values: np.ndarray) -> np.ndarray:
    if feature.clip is not None:
        values = np.clip(values, *feature.clip)
    return np.log1p(np.maximum(values, 0.0)) if feature.log else values


def fit(spec: FeatureSpec, raw: pa.Table) -> FeatureState:
    """A state of ``spec`` from ``raw`` in numpy, shaped as Spark's fit shapes it."""
    vocabularies: dict[str, list[str]] = {}
    moments: dict[str, tuple[float, float]] = {}
    boundaries: dict[str, list[float]] = {}
    for feature in spec.features:
        name = feature_name(feature)
        if isinstance(feature, Vocabulary):
            counts = pd.Series(raw.column(feature.column).to_pylist()).dropna().astype(str)
            frequent = counts.value_counts()
            frequent = frequent[frequent >= feature.min_frequency]
            ordered = sorted(frequent.items(), key=lambda kv: (-kv[1], kv[0]))
            vocabularies[name] = [value for value, _ in ordered[: feature.max_size]]
        elif isinstance(feature, Numeric | Bucketized):
            values = raw.column(feature.column).to_pandas().dropna().to_numpy(np.float64)
            x = _transformed(feature, values)
            if isinstance(feature, Bucketized):
                cuts = np.quantile(x, np.arange(1, feature.buckets) / feature.buckets)
                boundaries[name] = sorted({float(c) for c in cuts})
            elif feature.fitted:
                moments[name] = (float(x.mean()), float(x.std()))
    return FeatureState(spec.name, spec.fingerprint, vocabularies, moments, boundaries)


def build_model(folder: Path, raw: pa.Table) -> tuple[str, str]:
    """The raw-input pyfunc of the demo's model, registered in a SQLite store under ``folder``;
    (its model URI, the tracking URI)."""
    import mlflow

    from trainers.models import build_model as build
    from trainers.serving import log_model

    spec = ctr_features()
    state = fit(spec, raw)
    features = ServingFeatures.for_stage(ctr_backfill(), "backfill", state, raw.slice(0, 2))
    rows = layout(spec, state)
    tracking = f"sqlite:///{folder / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking)
    experiment = client.create_experiment("bench-serve", artifact_location=str(folder / "art"))
    run_id = client.create_run(experiment).info.run_id
    model = build(ModelConfig("dlrm"), rows)
    log_model(model, rows, run_id, tracking_uri=tracking, register_as="bench", features=features)
    client.set_terminated(run_id)
    return "models:/bench/1", tracking


def percentiles(seconds: list[float], prefix: str = "") -> dict[str, float]:
    ms = np.asarray(seconds) * 1000
    return {
        f"{prefix}p50_ms": float(np.percentile(ms, 50)),
        f"{prefix}p99_ms": float(np.percentile(ms, 99)),
        f"{prefix}mean_ms": float(ms.mean()),
    }


def timed(
    prepare: Callable[[int], Any], call: Callable[[Any], object], requests: int, warmup: int
) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of this thread for each of ``requests`` calls ``call(prepare(i))``,
    after ``warmup`` untimed ones; ``prepare`` runs before the clock starts. The CPU time is what
    a request costs on a core of its own: on a shared machine the wall time's tail is mostly
    waiting for one.

    Each request's input is made just before it and dropped after, as a server's are: inputs
    made all at once beforehand stay alive, grow as pandas caches their columns, and bring
    Python's full collections over them into the requests (60-450 ms each, every few hundred)."""
    for i in range(warmup):
        call(prepare(i))
    wall, cpu = [], []
    for i in range(requests):
        given = prepare(warmup + i)
        started, used = time.perf_counter(), time.thread_time()
        call(given)
        cpu.append(time.thread_time() - used)
        wall.append(time.perf_counter() - started)
        del given
    return wall, cpu


def frame(raw: pd.DataFrame, size: int, i: int) -> pd.DataFrame:
    """The ``i``-th request: ``size`` consecutive rows, wrapping round the rows."""
    n = len(raw)
    return raw.iloc[[(i * size + j) % n for j in range(size)]].reset_index(drop=True)


def in_process(
    model: Any, pool: pd.DataFrame, size: int, requests: int, warmup: int
) -> tuple[list[float], list[float]]:
    return timed(lambda i: frame(pool, size, i), model.predict, requests, warmup)


def over_http(
    url: str, pool: pd.DataFrame, size: int, requests: int, warmup: int
) -> tuple[list[float], list[float]]:
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    headers = {"Content-Type": "application/json"}

    def body(i: int) -> str:
        split = json.loads(frame(pool, size, i).to_json(orient="split", index=False))
        return json.dumps({"dataframe_split": split})

    def post(given: str) -> None:
        connection.request("POST", "/invocations", given, headers)
        response = connection.getresponse()
        answer = response.read()
        if response.status != 200:
            raise RuntimeError(f"the server answered {response.status}: {answer[:500]!r}")

    try:
        return timed(body, post, requests, warmup)
    finally:
        connection.close()


def profile(model: Any, requests: list[pd.DataFrame]) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    for frame in requests:
        model.predict(frame)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


def run(args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    import mlflow

    raw = raw_impressions(max(args.rows, 200))
    if args.model:
        uri, tracking = args.model, StackConfig.from_env().mlflow.tracking_uri
    else:
        uri, tracking = build_model(folder, raw)
    mlflow.set_tracking_uri(tracking)
    model = mlflow.pyfunc.load_model(uri)
    columns = model.metadata.get_input_schema().input_names()
    table = raw.select(columns)
    pool = table.to_pandas()
    results = []
    for size in SIZES:
        if args.profile:
            print(f"-- profile, {size} row(s) a request")
            profile(model, [frame(pool, size, i) for i in range(300)])
        wall, cpu = in_process(model, pool, size, args.requests, args.warmup)
        figures = {**percentiles(wall), **percentiles(cpu, "cpu_"), "requests": len(wall)}
        results.append({"path": "in-process", "rows": size, **figures})
        _show(results[-1])
    if not args.no_http:
        with model_server(uri, tracking_uri=tracking, log=folder / "serve.log") as url:
            for size in SIZES:
                # The server's CPU is not this thread's: wall time only.
                wall, _ = over_http(url, pool, size, args.requests, args.warmup)
                figures = {**percentiles(wall), "requests": len(wall)}
                results.append({"path": "http", "rows": size, **figures})
                _show(results[-1])
    return results


def _show(result: dict[str, Any]) -> None:
    cpu = (
        f"  CPU p50 {result['cpu_p50_ms']:6.2f} ms  p99 {result['cpu_p99_ms']:6.2f} ms"
        if "cpu_p50_ms" in result
        else ""
    )
    print(
        f"{result['path']:>10} {result['rows']:>4} row(s): p50 {result['p50_ms']:7.2f} ms  "
        f"p99 {result['p99_ms']:7.2f} ms{cpu}  ({result['requests']} requests; load "
        f"{os.getloadavg()[0]:.1f})",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="timed requests per case")
    parser.add_argument("--warmup", type=int, default=50, help="untimed requests first")
    parser.add_argument("--rows", type=int, default=20_000, help="generated impressions to draw")
    parser.add_argument("--model", help="a model URI of the stack's registry (default: build)")
    parser.add_argument("--no-http", action="store_true", help="in process only")
    parser.add_argument("--profile", action="store_true", help="cProfile in-process predict")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        results = run(args, Path(tmp))
    print(f"results: {save('serve', results, indent=1)}")


if __name__ == "__main__":
    main()
