"""A writer task's regrouping of rows by bucket (pure pyarrow, no Spark session)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.handoff import BUCKET, _Buckets


def batches(sizes: list[int], buckets: int, seed: int) -> list[pa.RecordBatch]:
    rng = np.random.default_rng(seed)
    out, start = [], 0
    for size in sizes:
        ids = np.arange(start, start + size)
        out.append(
            pa.record_batch({"id": ids, BUCKET: rng.integers(0, buckets, size).astype(np.int32)})
        )
        start += size
    return out


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=12),
    buckets=st.integers(1, 6),
    max_rows=st.integers(1, 400),
    seed=st.integers(0, 2**16),
)
def test_every_row_lands_once_in_a_shard_of_its_bucket_within_the_bounds(
    sizes: list[int], buckets: int, max_rows: int, seed: int
) -> None:
    given_batches = batches(sizes, buckets, seed)
    bucket_of = {
        i: b
        for batch in given_batches
        for i, b in zip(batch["id"].to_pylist(), batch[BUCKET].to_pylist(), strict=True)
    }
    shards: list[tuple[int, list[int]]] = []
    held: list[int] = []
    grouper = _Buckets(
        lambda b, t: shards.append((b, t.column("id").to_pylist())),
        max_rows,
        np.random.default_rng(seed),
    )
    for batch in given_batches:
        grouper.add(batch)
        held.append(grouper._held)
    grouper.finish()

    written = [i for _, ids in shards for i in ids]
    assert sorted(written) == sorted(bucket_of)  # every row once
    for bucket, ids in shards:
        assert 0 < len(ids) <= max_rows
        assert {bucket_of[i] for i in ids} == {bucket}
    # Memory: after each batch, at most twice a shard's rows are held.
    assert all(h <= 2 * max_rows for h in held)


def test_a_shards_rows_are_permuted_across_the_batches_they_came_in() -> None:
    shards: list[list[int]] = []
    grouper = _Buckets(
        lambda b, t: shards.append(t.column("id").to_pylist()), 10_000, np.random.default_rng(0)
    )
    for batch in batches([500] * 8, 1, seed=1):
        grouper.add(batch)
    grouper.finish()
    [ids] = shards
    assert sorted(ids) == list(range(4000))
    # Rows of the first input batch are spread over the shard, not kept at its start.
    assert np.mean([i < 500 for i in ids[:500]]) < 0.3
