"""The PyTorch side of Primus Flow: datasets over the handoff, models, the training loop.

Imports ``flow`` (the engine-neutral core), never ``spark_jobs``: the two sides meet only at the
handoff format. ``python -m trainers doctor`` checks a trainer machine (torch, CUDA, NCCL).
"""

__all__: list[str] = []
