"""The trained model as a pyfunc: its predictor, its frame of inputs, its saved weights (logged
and registered in MLflow by ``trainers.serving.log_model``).

The pyfunc takes one row per prediction with a column per feature, named as in the feature
layout: dense features as floats, categorical features as their indices (int64), sequence
features (``seq_<name>``) as lists of indices, ``Id`` features as their raw int64 ids (the model
carries its dynamic tables' mappings, in eval mode: it looks ids up, never admits). It returns
the click probability. Serving code therefore applies the same feature state as the pipeline did
(the layout names it).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from flow.pipeline.state import Layout
from flow.training import ModelConfig
from trainers.models import CTRModel, build_model

__all__ = ["CTRPredictor", "batch_from_frame", "example_frame", "one_thread", "save_model"]


def example_frame(layout: Layout, rows: int = 2) -> pd.DataFrame:
    """A frame of the pyfunc's input: zeros for numbers, index 1 for categories."""
    data: dict[str, Any] = {name: np.zeros(rows, dtype=np.float32) for name in layout.dense}
    data |= {name: np.ones(rows, dtype=np.int64) for name, _ in layout.sparse}
    data |= {name: np.ones(rows, dtype=np.int64) for name in layout.ids}
    for name, _, length in layout.sequences:
        data[f"seq_{name}"] = [np.ones(length, dtype=np.int64) for _ in range(rows)]
    return pd.DataFrame(data)


def batch_from_frame(frame: pd.DataFrame, layout: Layout) -> dict[str, torch.Tensor]:
    """The model's batch from the pyfunc's input; a missing column is named."""
    wanted = [*layout.dense, *(n for n, _ in layout.sparse), *layout.ids]
    wanted += [f"seq_{n}" for n, _, _ in layout.sequences]
    missing = [c for c in wanted if c not in frame.columns]
    if missing:
        raise ValueError(f"input lacks the feature column(s) {', '.join(missing)}")
    batch: dict[str, torch.Tensor] = {}
    if layout.dense:
        dense = frame[list(layout.dense)].to_numpy(dtype=np.float32)
        batch["dense"] = torch.from_numpy(np.ascontiguousarray(dense))
    if layout.sparse:
        sparse = frame[[n for n, _ in layout.sparse]].to_numpy(dtype=np.int64)
        batch["sparse"] = torch.from_numpy(np.ascontiguousarray(sparse))
    if layout.ids:
        ids = frame[list(layout.ids)].to_numpy(dtype=np.int64)
        batch["ids"] = torch.from_numpy(np.ascontiguousarray(ids))
    for name, _, length in layout.sequences:
        values = np.stack([np.asarray(v, dtype=np.int64)[:length] for v in frame[f"seq_{name}"]])
        batch[f"seq_{name}"] = torch.from_numpy(values)
    return batch


@contextmanager
def one_thread() -> Iterator[None]:
    """Torch's operators on one thread while the block runs (the count is global to the
    process: restored after). A request's rows are too few to share out: waking a second thread
    for each operator cost more than the work, 5 ms against 4 us for a one-row embedding bag on
    a busy two-core machine, and 1.0 ms against 0.03 ms for a hundred rows."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def settle_collector() -> None:
    """Move every object alive now (the model, MLflow, torch, pandas: millions of them) out of
    the garbage collector's generations, once a predictor has loaded. Python's full collection
    walks all of them: 350-450 ms, every ~1,200 one-row requests (flow bench serve's loop),
    in the request it lands on. What is frozen is what serving keeps anyway; what requests make
    is collected as before."""
    gc.collect()
    gc.freeze()


def _mlflow_pyfunc() -> Any:
    import mlflow.pyfunc

    return mlflow.pyfunc


class CTRPredictor(_mlflow_pyfunc().PythonModel):  # type: ignore[misc]
    """Click probabilities from a frame of feature values."""

    def load_context(self, context: Any) -> None:
        self.load_parts(context)
        settle_collector()  # once, after every part is loaded

    def load_parts(self, context: Any) -> None:
        """The model from ``context``'s artifacts (a subclass adds its own parts)."""
        saved = torch.load(context.artifacts["model"], map_location="cpu", weights_only=False)
        self.layout = Layout.from_dict(saved["layout"])
        self.model = build_model(ModelConfig(**saved["model_config"]), self.layout)
        self.model.load_state_dict(saved["state"])
        self.model.eval()

    # A DataFrame hint gives MLflow no schema of its own: the signature log_model() passes holds.
    def predict(
        self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> np.ndarray:
        """Click probabilities of ``model_input``'s rows."""
        with torch.no_grad(), one_thread():
            logits = self.model(batch_from_frame(model_input, self.layout))
        result: np.ndarray = torch.sigmoid(logits.float()).numpy()
        return result


def save_model(model: CTRModel, layout: Layout, path: Path) -> Path:
    """The model's artifact: its weights (and a baseline's counts), config and layout, which
    :class:`CTRPredictor` (and the champion's warm start) build the same model from."""
    torch.save(
        {
            "state": model.state_dict(),
            "model_config": asdict(model.config),
            "layout": layout.to_dict(),
        },
        path,
    )
    return path
