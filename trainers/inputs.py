"""What a training run reads, and where it runs: the device, the process group, the readers
over its channels (one, mixed by weight, or in order), the held-out buckets, the layout.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from flow.errors import ConfigError
from flow.handoff import Channel, ChannelReader, MixedReader, ReadOptions, World
from flow.pipeline.state import Layout
from flow.training import TrainConfig
from flow.transform.serving import ServingFeatures
from trainers.lazy import LazyReader

__all__ = [
    "columns_of",
    "device_for",
    "features_of",
    "holdout",
    "layout_of",
    "needed_now",
    "reader_for",
    "start_distributed",
    "wait_for",
]


def device_for(choice: str) -> torch.device:
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible; use --device cpu")
    if choice == "cuda":  # torchrun's LOCAL_RANK picks this process's GPU
        choice = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    return torch.device(choice)


def start_distributed(device: torch.device) -> World:
    world = World.from_env()
    if world.world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timedelta(minutes=10))
        if device.type == "cuda":
            torch.cuda.set_device(device)
    return world


def reader_for(
    config: TrainConfig,
    world: World,
    channels: tuple[str, ...],
    *,
    train: bool,
    buckets: frozenset[int] | None = None,
) -> Any:
    options = ReadOptions(
        batch_size=config.batch,
        window_rows=config.batch * config.window_batches,
        shuffle=train,
        seed=config.seed,
        follow=config.follow and train,
        whole_commits=not config.full_batches,
        # Retention needs every bucket read: a reader of a subset records nothing.
        consumer_group=config.consumer_group if train and buckets is None else None,
        buckets=buckets,
        after_commit=config.after_commit,
        threads=config.reader_threads,
    )
    if len(channels) == 1:
        return ChannelReader(config.location, channels[0], world=world, options=options)
    if config.mix:
        readers = {
            c: ChannelReader(config.location, c, world=world, options=options) for c in channels
        }
        return MixedReader(readers, weights=config.mix, seed=config.seed)
    # In order: a later channel opens when the earlier ones are done, so a trainer can start on
    # the history while the live stage has not yet written its first commit.
    first = ChannelReader(config.location, channels[0], world=world, options=options)
    later = {
        c: LazyReader(
            config.location,
            c,
            world,
            options,
            config.wait_for_channels,
            first.channel.meta().layout,
        )
        for c in channels[1:]
    }
    return MixedReader({channels[0]: first, **later}, priority=list(channels), seed=config.seed)


def holdout(config: TrainConfig) -> tuple[frozenset[int] | None, frozenset[int] | None]:
    """(held out, trained on): the first share of the buckets and the rest (rows hash to
    buckets, so this is a random slice, the same every run); (None, None) without a share."""
    if not config.holdout_share:
        return None, None
    total = ChannelReader(config.location, config.channels[0]).channel.meta().num_buckets
    held = frozenset(range(max(1, round(config.holdout_share * total))))
    return held, frozenset(range(total)) - held


def needed_now(config: TrainConfig) -> tuple[str, ...]:
    """The channels a run needs before its first step: read in order, only the first."""
    return config.channels if config.mix or len(config.channels) == 1 else config.channels[:1]


def wait_for(config: TrainConfig, say: Callable[[str], None]) -> None:
    """Until the channels exist (a writer creates one with its first batch), or time is up."""
    deadline = time.monotonic() + config.wait_for_channels
    said = False
    while True:
        missing = [c for c in needed_now(config) if not Channel(config.location, c).exists()]
        if not missing or time.monotonic() >= deadline:
            return  # a channel still missing fails below, naming what exists
        if not said:
            say(f"waiting for channel(s) {', '.join(missing)} in {config.location}")
            said = True
        time.sleep(1.0)


def layout_of(config: TrainConfig) -> Layout:
    """The feature layout the channels were written with (all of them must agree)."""
    layouts = {}
    for name in needed_now(config):
        meta = ChannelReader(config.location, name).channel.meta()
        if not meta.layout:
            raise ConfigError(
                f"channel {name!r} in {config.location} records no feature layout: it was not "
                "written by a pipeline stage (write it with ExportOptions(layout=...))"
            )
        layouts[name] = meta.layout
    if len({str(v) for v in layouts.values()}) > 1:
        raise ConfigError(
            f"channels {sorted(layouts)} have different feature layouts; train on channels of "
            "one feature spec and feature state"
        )
    return Layout.from_dict(next(iter(layouts.values())))


def features_of(handoff: str, channels: tuple[str, ...]) -> tuple[ServingFeatures | None, str]:
    """What the stages of ``channels`` (those that exist) recorded of their features (the
    first's, with the first example rows any holds), for a model serving on raw events; or
    None and why not.

    Channels of one layout agree on the spec and state (:func:`layout_of`), unless one was
    written with another state of the same sizes: that is refused here, since a served model
    applies one state."""
    found: dict[str, ServingFeatures] = {}
    for name in channels:
        channel = Channel(handoff, name)
        if not channel.exists():
            continue  # a channel read later that never came: nothing of it was trained on
        plain = channel.features()
        if plain is None:
            return None, (
                f"channel {name!r} records no features (it was written before channels did, or "
                "not by a pipeline stage)"
            )
        found[name] = ServingFeatures.from_dict(plain)
    if not found:
        return None, "none of the channels exists"
    first = next(iter(found.values()))
    versions = {n: f.state.version for n, f in found.items()}
    if len(set(versions.values())) > 1:
        raise ConfigError(
            f"channels were written with different feature states ({versions}); a served model "
            "applies one: train on channels of one feature state"
        )
    if not first.servable:
        return None, "; ".join(first.outside_spark)
    example = next((f.example for f in found.values() if f.example), ())
    return dataclasses.replace(first, example=example), ""


def columns_of(layout: Layout) -> list[str]:
    columns = ["label"]
    if layout.dense:
        columns.append("dense")
    if layout.sparse:
        columns.append("sparse")
    if layout.ids:
        columns.append("ids")
    columns += [f"seq_{name}" for name, _, _ in layout.sequences]
    return columns
