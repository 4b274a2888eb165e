"""Training fed by the handoff against the same training fed from memory, in the same run.

    flow bench trainer                                   # DLRM, Criteo-shaped, batch 4096
    python benchmarks/trainer.py --steps 200 --batch-size 8192 --device cuda

The same model (DLRM over 13 dense and 26 categorical Criteo-shaped features) trains the same
number of steps twice: once on batches already in memory (on the device), once on batches read
from a handoff channel through the trainer's loader (shuffled reader, pinned memory and a
side-stream copy on CUDA). Reported: steps/s and samples/s of both, the data-stall fraction of
the handoff run (time the loop waited for its next batch over the whole step time, as the
trainer measures it) and the slowdown, handoff time / in-memory time. A GPU's steps are short,
so that is where stalls show; the target there is under 5 % for a DLRM-sized model.

Results print and go to $FLOW_HOME/bench/trainer-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from datetime import UTC, datetime
from typing import Any

import torch
from handoff import CARDINALITIES, DENSE, SPARSE, criteo_rows, write_channel
from torch import nn

from flow.config import StackConfig
from flow.console import console
from flow.handoff import ChannelReader, ReadOptions
from flow.pipeline.state import Layout
from trainers.loader import DeviceLoader
from trainers.models import ModelConfig, build_model
from trainers.optim import OptimConfig, build_optimizer

out = console()
LAYOUT = Layout(
    dense=tuple(f"d{j}" for j in range(DENSE)),
    sparse=tuple((f"c{j}", int(CARDINALITIES[j])) for j in range(SPARSE)),
    sequences=(),
)


def step_fn(device: torch.device, max_rows: int, bf16: bool) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(
            "dlrm", embedding_dim=16, hidden=(512, 256), bottom=(128,), max_embedding_rows=max_rows
        ),
        LAYOUT,
    ).to(device)
    optimizer = build_optimizer(model, OptimConfig(lr=1e-3))

    def step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(batch)
        loss = nn.functional.binary_cross_entropy_with_logits(logits.float(), batch["label"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        return loss.detach()

    return model, step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def in_memory(
    args: argparse.Namespace, device: torch.device, loader: DeviceLoader
) -> dict[str, Any]:
    """The same first ``steps`` batches, copied to the device before the clock starts."""
    batches: list[dict[str, torch.Tensor]] = []
    for item in loader:
        batches.append({k: v.to(device, copy=True) for k, v in item.tensors.items()})
        if len(batches) == args.steps + args.warmup:
            break
    _, step = step_fn(device, args.max_embedding_rows, args.bf16)
    for batch in batches[: args.warmup]:
        step(batch)
    sync(device)
    started = time.perf_counter()
    for batch in batches[args.warmup :]:
        step(batch)
    sync(device)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "samples_per_s": args.steps * args.batch_size / seconds}


def from_handoff(
    args: argparse.Namespace, device: torch.device, loader: DeviceLoader
) -> dict[str, Any]:
    _, step = step_fn(device, args.max_embedding_rows, args.bf16)
    waited = 0.0
    started = 0.0
    for done, batch in enumerate(loader, start=1):
        step(batch.tensors)
        waited += batch.wait_s
        if done == args.warmup:  # the clock starts after the warm-up steps
            sync(device)
            started, waited = time.perf_counter(), 0.0
        if done == args.steps + args.warmup:
            break
    sync(device)
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "samples_per_s": args.steps * args.batch_size / seconds,
        "data_stall_fraction": waited / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="Trainer data-stall benchmark")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--max-embedding-rows", type=int, default=2**17)
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    args.bf16 = device.type == "cuda" if args.bf16 is None else args.bf16
    rows = (args.steps + args.warmup) * args.batch_size
    root = StackConfig.from_env().home / "bench" / "trainer-data"
    shutil.rmtree(root, ignore_errors=True)
    out.print(f"writing {rows:,} Criteo-shaped rows to a channel ...")
    write_channel(root, "criteo", [criteo_rows(rows // 2, s) for s in range(2)], 0, LAYOUT)

    def loader() -> DeviceLoader:
        options = ReadOptions(batch_size=args.batch_size, shuffle=True)
        reader = ChannelReader(str(root), "criteo", options=options)
        return DeviceLoader(reader, device, ["label", "dense", "sparse"])

    out.print(f"{args.steps} DLRM steps from memory, then from the handoff ({device}) ...")
    memory = in_memory(args, device, loader())
    handoff = from_handoff(args, device, loader())
    results = {
        "when": datetime.now(UTC).isoformat(),
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "batch_size": args.batch_size,
        "steps": args.steps,
        "bf16": args.bf16,
        "in_memory": memory,
        "handoff": handoff,
        "slowdown": handoff["seconds"] / memory["seconds"],
    }
    folder = root.parent
    path = folder / f"trainer-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    path.write_text(json.dumps(results, indent=2))
    shutil.rmtree(root, ignore_errors=True)
    out.print(
        f"in memory {memory['samples_per_s']:,.0f} samples/s; from the handoff "
        f"{handoff['samples_per_s']:,.0f} samples/s, data stall "
        f"{handoff['data_stall_fraction']:.1%}, slowdown {results['slowdown']:.3f}x"
    )
    out.print(f"results: {path}")


if __name__ == "__main__":
    main()
