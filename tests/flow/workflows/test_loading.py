"""History in a local Iceberg catalog (no services): the world it records, which a stream
reads back, p_click in the table, and an older table without p_click appended to."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.stack.iceberg import open_catalog
from flow.workflows.loading import dimensions, write_history
from flow.workflows.synthetic import IMPRESSIONS_SCHEMA, STATIC, SyntheticWorld
from tests.support import stack_env_for

END = datetime(2026, 3, 1, tzinfo=UTC)


@pytest.fixture
def stack(tmp_path: Path) -> StackConfig:
    return StackConfig.from_env(stack_env_for(tmp_path))


def test_the_history_records_its_world_and_a_stream_reads_it_back(stack: StackConfig) -> None:
    world = SyntheticWorld(seed=5, users=200, items=50)
    report = write_history(stack, world, namespace="w", days=2, per_day=300, end=END)
    assert report.world == SyntheticWorld(seed=5, users=200, items=50, anchor=END - timedelta(2))
    found = dimensions(stack, "w")
    assert found.recorded
    assert found.world == report.world
    assert len(found.items) == 50, "the items table holds every item, later ones included"
    history = open_catalog(stack.catalog).load_table("w.impressions_history").scan().to_arrow()
    assert len(history) == report.impressions == 600
    assert history.column("p_click").null_count == 0
    # --append keeps the recorded world, whatever world it is given.
    again = write_history(stack, STATIC, namespace="w", days=1, per_day=100, append=True, end=END)
    assert again.world == report.world


def test_history_appended_to_a_table_without_p_click_gains_the_column(stack: StackConfig) -> None:
    world = SyntheticWorld(users=50, items=20)
    write_history(stack, world, namespace="old", days=1, per_day=100, end=END)
    catalog = open_catalog(stack.catalog)
    old = pa.schema([f for f in IMPRESSIONS_SCHEMA if f.name != "p_click"])
    catalog.drop_table("old.impressions_history")
    catalog.create_table("old.impressions_history", schema=old)
    write_history(stack, STATIC, namespace="old", days=1, per_day=100, append=True, end=END)
    rows = catalog.load_table("old.impressions_history").scan().to_arrow()
    assert "p_click" in rows.column_names
    assert rows.column("p_click").null_count == 0


def test_a_stream_without_history_says_what_to_run(stack: StackConfig) -> None:
    with pytest.raises(ConfigError, match="flow generate history"):
        dimensions(stack, "nothing")
