"""Shuffle partitions a stage gets when the user did not say (spark_jobs.partitions)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from spark_jobs.partitions import MAX_PARTITIONS, TARGET_PARTITION_BYTES, partitions_for

cores = st.integers(min_value=1, max_value=512)
sizes = st.none() | st.integers(min_value=0, max_value=1 << 50)


@given(cores, sizes)
def test_at_least_one_partition_a_core_and_never_fewer_than_two(n: int, size: int | None) -> None:
    assert partitions_for(n, size) >= max(2, n)


@given(cores, sizes)
def test_a_partition_holds_about_the_target_unless_capped(n: int, size: int | None) -> None:
    p = partitions_for(n, size)
    if size is not None and p < MAX_PARTITIONS:
        assert size / p <= TARGET_PARTITION_BYTES
    assert p <= max(2, n, MAX_PARTITIONS)


@given(
    cores, st.integers(min_value=0, max_value=1 << 45), st.integers(min_value=0, max_value=1 << 45)
)
def test_more_input_never_means_fewer_partitions(n: int, a: int, b: int) -> None:
    small, large = sorted((a, b))
    assert partitions_for(n, small) <= partitions_for(n, large)


def test_spark_default_of_200_is_not_what_a_small_input_on_two_cores_gets() -> None:
    assert partitions_for(2, 50_000 * 200) == 2
    assert partitions_for(2, None) == 2
