"""A training step captured once as a CUDA graph and replayed for every later batch.

At small batches a CTR model's step is launch-bound: DLRM at 16k rows is ~6 ms of a few hundred
short kernels, and the Python loop that launches them shares the GIL with the loader's thread,
so the GPU idles between kernels (78-87 % utilisation even from memory, a 20 % data stall from
the handoff on an H100, 2026-11-22). Replaying a graph launches the whole step at once: the loop
only copies the batch into the graph's input buffers and calls ``replay()``.

What capture needs, and why each rule is here:

* every batch of the same shapes and dtypes: the graph's buffers are fixed. A batch of other
  shapes (an epoch's short last batch) runs eagerly; :attr:`GraphedStep.eager_steps` counts them;
* no host synchronisation in the step (``.item()``, data-dependent shapes): capture fails with
  CUDA's own error, raised as is;
* an optimizer whose state lives on the device: Adam or AdamW with ``capturable=True``
  (``trainers.optim.build_optimizer(..., capturable=True)``); torch refuses others in capture;
* ``torch.autocast(..., cache_enabled=False)`` inside the step: a cast cached outside the graph
  would be read stale;
* warm-up steps on a side stream before capture (cuBLAS and autograd allocate lazily).

Every batch is trained on exactly once: the first ``warmup`` batches run eagerly on the side
stream, the next one is captured (capture records and runs nothing) and then replayed.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Generic, TypeVar

import torch
from torch import Tensor

from flow.errors import ConfigError

__all__ = ["GraphedStep"]

Out = TypeVar("Out", Tensor, tuple[Tensor, ...])
"""What a step returns: a tensor (its loss) or a tuple of tensors (the loss, the logits)."""


@contextmanager
def _eager_on_purpose() -> Iterator[None]:
    """A capturable optimizer run outside capture warns that capturable=True costs speed; here
    the eager steps are the warm-up and the odd-shaped batches, so the warning says nothing."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*capturable=True.*", category=UserWarning)
        yield


class GraphedStep(Generic[Out]):
    """``step(batch) -> loss``, run eagerly ``warmup`` times, then captured and replayed.

    ``step`` does the whole update (forward, loss, ``zero_grad(set_to_none=True)``, backward,
    ``optimizer.step()``) and returns the loss tensor, or a tuple of tensors. What a replay
    returns are the graph's own output buffers: the next replay overwrites them, so clone what
    is kept.
    """

    def __init__(
        self, step: Callable[[Mapping[str, Tensor]], Out], device: torch.device, *, warmup: int = 3
    ) -> None:
        if device.type != "cuda":
            raise ConfigError(
                f"a CUDA graph step needs a CUDA device, not {device}; leave the graph off there"
            )
        if warmup < 1:
            raise ConfigError(f"warmup must be >= 1 (eager steps before capture), not {warmup}")
        self._step: Callable[[Mapping[str, Tensor]], Out] = step
        self._device = device
        self._warmup = warmup
        self._side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self._graph: torch.cuda.CUDAGraph | None = None
        self._inputs: dict[str, Tensor] = {}
        self._out: Out | None = None
        self.steps = 0
        self.eager_steps = 0

    @property
    def captured(self) -> bool:
        return self._graph is not None

    def __call__(self, batch: Mapping[str, Tensor]) -> Out:
        self.steps += 1
        if self._graph is not None:
            if self._fits(batch):
                return self._replay(batch)
            self.eager_steps += 1
            with _eager_on_purpose():
                return self._step(batch)
        if self.steps <= self._warmup:
            return self._on_side_stream(batch)
        return self._capture(batch)

    def _fits(self, batch: Mapping[str, Tensor]) -> bool:
        inputs = self._inputs
        return batch.keys() == inputs.keys() and all(
            v.shape == inputs[k].shape and v.dtype == inputs[k].dtype for k, v in batch.items()
        )

    def _replay(self, batch: Mapping[str, Tensor]) -> Out:
        assert self._graph is not None
        assert self._out is not None
        for name, value in batch.items():
            self._inputs[name].copy_(value, non_blocking=True)
        self._graph.replay()
        return self._out

    def _on_side_stream(self, batch: Mapping[str, Tensor]) -> Out:
        current = torch.cuda.current_stream(self._device)
        self._side.wait_stream(current)
        with torch.cuda.stream(self._side), _eager_on_purpose():
            out = self._step(batch)
        current.wait_stream(self._side)
        return out

    def _capture(self, batch: Mapping[str, Tensor]) -> Out:
        """Record the step on ``batch``'s copy, then replay it once to train on ``batch``."""
        self._inputs = {name: value.clone() for name, value in batch.items()}
        torch.cuda.synchronize(self._device)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the loader's thread keeps copying and allocating on its own stream
        # while this one captures; "global" would fail the capture for its calls.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = self._step(self._inputs)
        self._out = out
        self._graph = graph
        graph.replay()
        return out
