"""Mixing channels, on real shard files: proportions, every row once, seeds, resume, ranks in step.

Each mixed batch is named by (channel, its row ids): ids restart at 0 in every channel.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flow.errors import ConfigError
from flow.handoff import ChannelReader, MixedReader, ReadOptions, World
from tests.support import Writer

#: Commits (rows per shard) of each channel: different sizes, so the channels run out at
#: different draws; batches of 8 give each channel 300-400 of them on one rank.
CHANNELS = {
    "a": [[700, 500, 300, 100], [600, 200]],
    "b": [[900, 900], [400, 300, 300, 200]],
    "c": [[1000, 600, 400, 400], [800]],
}
BATCH = 8

Drawn = list[tuple[str, tuple[int, ...]]]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("mix")
    for name, commits in CHANNELS.items():
        writer = Writer(folder, name, buckets=4)
        for sizes in commits:
            writer.commit(sizes)
    return folder


def weighted(root: Path, weights: dict[str, float], seed: int, world: World) -> MixedReader:
    options = ReadOptions(batch_size=BATCH, seed=seed)
    readers = {n: ChannelReader(str(root), n, world=world, options=options) for n in weights}
    return MixedReader(readers, weights=weights, seed=seed)


def drawn(mix: MixedReader, limit: int | None = None) -> Drawn:
    out: Drawn = []
    for batch in mix:
        assert mix.last_channel is not None
        out.append((mix.last_channel, tuple(batch.column("id").to_pylist())))
        if limit is not None and len(out) >= limit:
            break
    return out


weight_maps = st.sampled_from([("a", "b"), ("b", "c"), ("a", "b", "c")]).flatmap(
    lambda names: st.fixed_dictionaries({n: st.floats(0.25, 4.0) for n in names})
)


@settings(max_examples=25, deadline=None)
@given(weights=weight_maps, seed=st.integers(0, 2**32 - 1), world_size=st.sampled_from([1, 2]))
def test_a_weighted_mix_keeps_ranks_in_step_draws_in_proportion_and_delivers_every_row_once(
    root: Path, weights: dict[str, float], seed: int, world_size: int
) -> None:
    per_rank = [
        drawn(weighted(root, weights, seed, World(rank, world_size))) for rank in range(world_size)
    ]
    # Every rank draws the same channel before each batch, or DDP would pair unlike batches.
    sequence = [name for name, _ in per_rank[0]]
    assert all([name for name, _ in mixed] == sequence for mixed in per_rank)

    delivered = Counter((name, i) for mixed in per_rank for name, ids in mixed for i in ids)
    rows = {n: sum(sum(c) for c in CHANNELS[n]) for n in weights}
    assert delivered == Counter((n, i) for n in weights for i in range(rows[n]))

    # Until the first channel runs out, each draw is independent with P(channel) = its share of
    # the weights: the counts must be within 5 standard deviations of that.
    totals, seen = Counter(sequence), Counter[str]()
    for name in sequence:
        seen[name] += 1
        if seen[name] == totals[name]:
            break
    draws = seen.total()
    for name, weight in weights.items():
        share = weight / sum(weights.values())
        tolerance = 5 * math.sqrt(share * (1 - share) / draws) + 1 / draws
        assert abs(seen[name] / draws - share) <= tolerance, (name, seen, draws, share)


@settings(max_examples=25, deadline=None)
@given(
    weights=weight_maps,
    seed=st.integers(0, 2**32 - 1),
    stop=st.integers(0, 1300),
    world_size=st.sampled_from([1, 2]),
)
def test_a_mix_is_decided_by_its_seed_and_resumes_with_exactly_the_rest(
    root: Path, weights: dict[str, float], seed: int, stop: int, world_size: int
) -> None:
    world = World(world_size - 1, world_size)
    uninterrupted = weighted(root, weights, seed, world)
    first_epoch = drawn(uninterrupted)
    reference = first_epoch + drawn(uninterrupted)  # epochs 0 and 1
    assert first_epoch != reference[len(first_epoch) :]  # the next epoch is mixed anew
    assert drawn(weighted(root, weights, seed, world)) == first_epoch
    assert drawn(weighted(root, weights, seed + 1, world)) != first_epoch

    interrupted = weighted(root, weights, seed, world)
    head = drawn(interrupted, limit=stop) if stop else []
    resumed = weighted(root, weights, seed, world)
    resumed.load_state_dict(interrupted.state_dict())
    # Two more passes cover a stop inside epoch 0, right after its last batch, or after it.
    assert (head + drawn(resumed) + drawn(resumed))[: len(reference)] == reference


def test_priority_reads_channels_one_after_the_other(root: Path) -> None:
    options = ReadOptions(batch_size=BATCH, seed=5)
    readers = {n: ChannelReader(str(root), n, options=options) for n in ("a", "b")}
    mix = MixedReader(readers, priority=["b", "a"])
    channels = [name for name, _ in drawn(mix)]
    b_batches = sum(sum(c) for c in CHANNELS["b"]) // BATCH
    assert channels == ["b"] * b_batches + ["a"] * (len(channels) - b_batches)

    with pytest.raises(ConfigError, match="exactly one of them"):
        MixedReader(readers, weights={"a": 1.0, "b": 1.0}, priority=["a", "b"])
    with pytest.raises(ConfigError, match=r"readers are for \['a', 'b'\]"):
        MixedReader(readers, weights={"a": 1.0, "c": 1.0})
    with pytest.raises(ConfigError, match="must all be positive"):
        MixedReader(readers, weights={"a": 1.0, "b": 0.0})
