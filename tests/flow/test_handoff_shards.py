"""Feature blocks as fixed-size lists (what Spark's array columns become in a shard)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flow.errors import HandoffError
from flow.handoff.shards import fixed_size_lists


@settings(deadline=None)  # the first example pays for imports
@given(
    chunk_rows=st.lists(st.integers(0, 30), min_size=1, max_size=4),
    width=st.integers(1, 6),
    offset=st.integers(0, 3),
)
def test_list_columns_become_fixed_size_lists_with_the_same_values(
    chunk_rows: list[int], width: int, offset: int
) -> None:
    rows = [[r * width + i for i in range(width)] for r in range(sum(chunk_rows) + offset)]
    chunks, start = [], offset  # sliced chunks: offsets that do not start at 0
    for n in chunk_rows:
        chunks.append(pa.array(rows, pa.list_(pa.int64())).slice(start, n))
        start += n
    table = pa.table({"block": pa.chunked_array(chunks), "id": pa.array(range(start - offset))})
    fixed = fixed_size_lists(table, {"block": width, "absent": 3})
    assert fixed.schema.field("block").type == pa.list_(pa.int64(), width)
    assert fixed.column("block").to_pylist() == rows[offset:start]
    assert fixed.column("id").equals(table.column("id"))


def test_lists_of_another_length_or_null_lists_name_the_column() -> None:
    uneven = pa.table({"dense": pa.array([[1.0, 2.0], [3.0]])})
    with pytest.raises(HandoffError, match=r"'dense' has lists of 1\.\.2 values; every row must"):
        fixed_size_lists(uneven, {"dense": 2})
    nulls = pa.table({"dense": pa.array([[1.0, 2.0], None])})
    with pytest.raises(HandoffError, match=r"'dense' has null lists"):
        fixed_size_lists(nulls, {"dense": 2})
