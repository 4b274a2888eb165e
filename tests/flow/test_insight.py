"""Training-data insight: statistics, a report with plots, and a planted drift named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from flow.config import StackConfig
from flow.errors import ConfigError
from flow.handoff import Channel, Commit
from flow.insight import channel_insight
from flow.insight.drift import psi
from tests.support import Writer, stack_env_for
from tests.trainers.channels import rows, write


def add_commit(root: Path, name: str, table: pa.Table) -> int:
    channel = Channel(str(root), name)
    batch_id = len(channel.commit_ids())
    shard = channel.write_bucket(batch_id, 0, table, "t0")
    channel.add_commit(Commit(name, batch_id, (shard,), channel.meta().fingerprint))
    return batch_id


def shifted(table: pa.Table, by: float) -> pa.Table:
    """The same rows with the second dense value (price) moved by ``by``."""
    dense = table.column("dense").combine_chunks().flatten().to_numpy().reshape(-1, 2).copy()
    dense[:, 1] += by
    array = pa.FixedSizeListArray.from_arrays(pa.array(dense.reshape(-1)), 2)
    return table.set_column(1, "dense", array)


def test_a_planted_drift_is_named_and_the_report_is_written(tmp_path: Path) -> None:
    stack = StackConfig.from_env(stack_env_for(tmp_path / "home"))
    write(tmp_path, "live", [4000], buckets=1)
    first, folder = channel_insight(stack, str(tmp_path), "live", [0])
    assert first.profile.rows == 4000
    assert first.profile.numeric["price"].count == 4000
    assert first.profile.categorical["country"].distinct <= 8
    assert any("no previous run" in f for f in first.findings)
    for name in ("report.html", "profile.json", "numeric.png", "categorical.png", "label_rate.png"):
        assert (folder / name).exists(), name

    same = add_commit(tmp_path, "live", rows(4000, seed=5))
    steady, _ = channel_insight(stack, str(tmp_path), "live", [same])
    assert not any(d.drifted for d in steady.drift), steady.drift
    assert any("no feature drifted" in f for f in steady.findings)

    moved = add_commit(tmp_path, "live", shifted(rows(4000, seed=6), by=2.0))
    drifted, folder = channel_insight(stack, str(tmp_path), "live", [moved])
    assert [d.feature for d in drifted.drift if d.drifted] == ["price"]
    assert drifted.findings[0].startswith("price drifted")
    assert "price drifted" in (folder / "report.html").read_text()


def test_psi_is_zero_for_equal_histograms_and_grows_with_the_shift() -> None:
    base = np.array([100, 100, 100, 100])
    assert psi(base, base) == pytest.approx(0.0)
    assert 0 < psi(base, [90, 110, 100, 100]) < psi(base, [10, 10, 190, 190])


def test_a_channel_without_a_layout_cannot_be_profiled(tmp_path: Path) -> None:
    stack = StackConfig.from_env(stack_env_for(tmp_path / "home"))
    Writer(tmp_path, "raw").commit([10])
    with pytest.raises(ConfigError, match="records no feature layout"):
        channel_insight(stack, str(tmp_path), "raw")


def test_the_report_embeds_its_plots_and_labels_its_bins(tmp_path: Path) -> None:
    stack = StackConfig.from_env(stack_env_for(tmp_path / "home"))
    write(tmp_path, "live", [2000], buckets=1)
    _, folder = channel_insight(stack, str(tmp_path), "live", [0])
    page = (folder / "report.html").read_text()
    # MLflow's artifact view serves report.html alone: a relative src would be a broken image.
    assert page.count('<img src="data:image/png;base64,') == 3
    assert 'src="numeric.png"' not in page


def test_a_run_is_never_its_own_reference(tmp_path: Path) -> None:
    stack = StackConfig.from_env(stack_env_for(tmp_path / "home"))
    write(tmp_path, "live", [4000], buckets=1)
    earlier, _ = channel_insight(stack, str(tmp_path), "live", [0], run_id="a" * 32)
    assert earlier.reference is None
    moved = add_commit(tmp_path, "live", shifted(rows(4000, seed=6), by=2.0))
    first, _ = channel_insight(stack, str(tmp_path), "live", [moved], run_id="b" * 32)
    again, _ = channel_insight(stack, str(tmp_path), "live", [moved], run_id="b" * 32)
    # Asked again, run b still compares with run a, not with its own first report (PSI 0).
    assert [d.feature for d in again.drift if d.drifted] == ["price"]
    assert again.drift == first.drift


def test_one_channel_against_another_names_the_other(tmp_path: Path) -> None:
    from flow.insight import _against

    stack = StackConfig.from_env(stack_env_for(tmp_path / "home"))
    write(tmp_path, "backfill", [4000], buckets=1)
    write(tmp_path, "live", [10], buckets=1)
    moved = add_commit(tmp_path, "live", shifted(rows(4000, seed=6), by=2.0))
    name, insight, folder = _against(
        stack, str(tmp_path), ("backfill", [0]), ("live", [moved]), "c" * 32
    )
    assert name == "live-vs-backfill"
    assert insight.findings[0].startswith("price drifted")
    assert "against channel backfill" in insight.findings[0]
    assert folder.name.endswith("c" * 32)


def test_numbers_are_reported_in_their_raw_units(tmp_path: Path) -> None:
    """A stage stores ages standardized and prices as standardized log1p; the report gives them
    back in years and money, from the units the channel records."""
    from flow.insight.report import number
    from flow.pipeline import FeatureSpec, Numeric, Vocabulary
    from flow.pipeline.state import FeatureState, layout, raw_units
    from flow.transform import FeatureTransform

    spec = FeatureSpec(
        "t", (Numeric("age", clip=(16, 90)), Numeric("price", log=True), Vocabulary("country"))
    )
    rng = np.random.default_rng(3)
    age = rng.normal(41.0, 12.0, 5000).clip(16, 90)
    price = rng.lognormal(3.0, 1.0, 5000)
    logged = np.log1p(price)
    moments = {"age": (age.mean(), age.std()), "price": (logged.mean(), logged.std())}
    state = FeatureState("t", spec.fingerprint, {"country": ["de", "fr"]}, moments)
    raw = pa.table(
        {
            "age": age,
            "price": price,
            "country": rng.choice(["de", "fr"], 5000),
            "label": rng.integers(0, 2, 5000),
        }
    )
    rows = FeatureTransform(spec, state).apply(raw)
    channel = Channel(str(tmp_path), "live")
    meta = channel.create(
        rows.schema,
        num_buckets=1,
        layout=layout(spec, state).to_dict(),
        units=raw_units(spec, state),
    )
    shard = channel.write_bucket(0, 0, rows, "t0")
    channel.add_commit(Commit("live", 0, (shard,), meta.fingerprint))
    stored = rows.column("dense").combine_chunks().flatten().to_numpy().reshape(-1, 2)
    assert abs(stored[:, 0].mean()) < 1e-3, "the channel holds standardized ages"

    stack = StackConfig.from_env(stack_env_for(tmp_path / "home"))
    insight, folder = channel_insight(stack, str(tmp_path), "live", [0])
    ages, prices = insight.profile.numeric["age"], insight.profile.numeric["price"]
    assert ages.raw
    assert prices.raw
    assert ages.mean == pytest.approx(age.mean(), rel=1e-4)  # float32 storage, nothing more
    assert ages.std == pytest.approx(age.std(), rel=1e-3)
    assert prices.quantiles["p50"] == pytest.approx(np.median(price), rel=1e-3)
    assert prices.mean == pytest.approx(price.mean(), rel=1e-3)
    # The bins are deciles of the raw values: the middle edge is the raw median.
    assert ages.edges[4] == pytest.approx(np.median(age), rel=1e-3)
    page = (folder / "report.html").read_text()
    assert f"<td>{number(ages.mean)}</td>" in page
    assert number(ages.mean) == f"{age.mean():.3g}"


def test_a_bin_is_labelled_with_its_range() -> None:
    from flow.insight.report import bin_label

    edges = [16.0, 24.5, 1250.0]
    assert [bin_label(edges, i) for i in range(4)] == ["<16", "16-24.5", "24.5-1,250", ">=1,250"]
    assert bin_label([], 0) == "all"


def test_a_channel_that_records_no_units_is_reported_as_stored(tmp_path: Path) -> None:
    stack = StackConfig.from_env(stack_env_for(tmp_path / "home"))
    write(tmp_path, "live", [500], buckets=1)  # as a channel of an older writer: no units
    insight, folder = channel_insight(stack, str(tmp_path), "live", [0])
    assert not insight.profile.numeric["price"].raw
    assert "as stored" in (folder / "report.html").read_text()
