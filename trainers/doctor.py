"""What a trainer machine offers: torch, CUDA devices, bf16, NCCL and gloo.

    python -m trainers doctor [--require-gpu] [--json]

The GPU image runs this first: a container that was not given its GPU reservation fails here,
with a message, rather than later as a slow CPU run.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist

__all__ = ["TrainerEnvironment", "inspect_environment"]


@dataclass(frozen=True)
class TrainerEnvironment:
    """The facts a trainer launch depends on."""

    torch: str
    cuda_available: bool
    cuda_runtime: str | None
    devices: list[str] = field(default_factory=list)
    bf16: bool = False
    nccl: str | None = None
    gloo: bool = False

    @property
    def backend(self) -> str:
        """The process-group backend DDP should use here."""
        return "nccl" if self.cuda_available and self.nccl else "gloo"


def inspect_environment() -> TrainerEnvironment:
    cuda = torch.cuda.is_available()
    devices = []
    if cuda:
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            devices.append(
                f"cuda:{index} {props.name} ({props.total_memory / 2**30:.0f} GiB, "
                f"sm_{props.major}{props.minor})"
            )
    nccl = None
    if cuda and dist.is_nccl_available():
        version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
        nccl = ".".join(str(part) for part in version)
    return TrainerEnvironment(
        torch=torch.__version__,
        cuda_available=cuda,
        cuda_runtime=torch.version.cuda,
        devices=devices,
        bf16=bool(cuda and torch.cuda.is_bf16_supported()),
        nccl=nccl,
        gloo=dist.is_gloo_available(),
    )


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m trainers doctor", description=__doc__)
    parser.add_argument("--require-gpu", action="store_true", help="exit 1 without a CUDA device")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    env = inspect_environment()
    if args.json:
        print(json.dumps({**asdict(env), "backend": env.backend}, indent=2))
    else:
        print(f"torch {env.torch} (CUDA runtime {env.cuda_runtime or 'none'})")
        for device in env.devices or ["no CUDA device: training runs on CPU"]:
            print(f"  {device}")
        print(
            f"bf16: {env.bf16}  nccl: {env.nccl or 'no'}  gloo: {env.gloo}  "
            f"DDP backend: {env.backend}"
        )
    if args.require_gpu and not env.cuda_available:
        print(
            "error: no CUDA device is visible. Give the container its GPU (compose: "
            "deploy.resources.reservations.devices; docker run --gpus all) and check nvidia-smi"
        )
        return 1
    return 0
