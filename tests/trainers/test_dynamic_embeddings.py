"""Dynamic embedding tables (trainers.dynamic): admission, expiry, eviction, bounded memory,
exact resume, agreement of DDP ranks, and the Id feature and its config.

Self-contained (no conftest fixtures; torch, hypothesis, pytest and the project only), so that a
GPU machine runs it as it is (``python3 -m pytest --noconftest -o filterwarnings=error`` and
this file).
"""

from __future__ import annotations

import io
import os
import socket
import tempfile
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flow.errors import ConfigError
from flow.pipeline.features import NULL_ID, FeatureSpec, Hashed, Id
from flow.pipeline.state import Layout, layout
from flow.training import EmbeddingConfig, ModelConfig
from trainers.dynamic import FREE, DynamicTable, initial_rows
from trainers.models import CTRModel, build_model

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
LAYOUT = Layout(dense=("price",), sparse=(("country", 5),), sequences=(), ids=("item", "user"))


def table(rows: int = 8, **settings_: object) -> DynamicTable:
    return DynamicTable(EmbeddingConfig("item", rows=rows, **settings_))  # type: ignore[arg-type]


def ids(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


def rows_of(t: DynamicTable, *values: int) -> list[int]:
    return [int(r) for r in t.lookup(ids(*values))]


def check_consistent(t: DynamicTable) -> None:
    """The invariants of a mapping: row 0 free, ids held once, the index answers for each."""
    keys = t.keys.tolist()
    assert keys[0] == FREE
    held = [k for k in keys if k != FREE]
    assert len(held) == len(set(held))
    for row, key in enumerate(keys):
        if key != FREE:
            assert rows_of(t, key) == [row]


# -- the mapping -------------------------------------------------------------------------------


def test_admission_after_min_count() -> None:
    t = table(min_count=3)
    t.update(ids(10, 20))
    t.update(ids(10))
    assert rows_of(t, 10, 20) == [0, 0]  # seen twice and once: not admitted, shared row 0
    t.update(ids(10, 30, 30, 30))  # 10 a third time; 30 three times in one step
    assert 0 not in rows_of(t, 10, 30)
    assert rows_of(t, 20) == [0]
    assert t.counts[t.lookup(ids(30))].item() == 3
    check_consistent(t)


def test_null_and_free_ids_map_to_row_zero_and_are_never_admitted() -> None:
    t = table()
    t.update(ids(NULL_ID, NULL_ID, FREE, 7))
    assert rows_of(t, NULL_ID, FREE) == [0, 0]
    assert int(t.occupied()) == 1


def test_expiry_in_steps() -> None:
    t = table(ttl=2)
    t.update(ids(1, 2))  # step 1
    t.update(ids(2))  # step 2
    t.update(ids(2))  # step 3: 1 was last seen at 1, within ttl
    assert 0 not in rows_of(t, 1, 2)
    t.update(ids(2))  # step 4: 1 not seen for 3 steps > ttl
    assert rows_of(t, 1) == [0]
    assert rows_of(t, 2) != [0]
    check_consistent(t)


def test_expiry_in_event_time_and_the_clock_never_runs_back() -> None:
    t = table(ttl=60, ttl_unit="seconds")
    t.update(ids(1), now=torch.tensor(1000))
    t.update(ids(2), now=torch.tensor(1030))
    t.update(ids(3), now=torch.tensor(900))  # a late batch: the clock stays at 1030
    assert int(t.clock) == 1030
    assert 0 not in rows_of(t, 1, 2, 3)
    t.update(ids(2), now=torch.tensor(1061))  # 1 last seen at 1000: expired
    assert rows_of(t, 1) == [0]
    assert 0 not in rows_of(t, 2)


def test_a_full_table_evicts_the_least_recently_seen() -> None:
    t = table(rows=4)  # 3 rows for ids
    for step_ids in ([1], [2], [3], [1], [4]):  # 2 is now the least recently seen
        t.update(ids(*step_ids))
    assert rows_of(t, 2) == [0]
    assert 0 not in rows_of(t, 1, 3, 4)
    check_consistent(t)


def test_a_full_table_evicts_the_least_often_seen_with_lfu() -> None:
    t = table(rows=4, eviction="lfu")
    t.update(ids(1, 1, 1, 2, 3, 3))
    t.update(ids(1))
    t.update(ids(4))  # 2 was seen once, the fewest
    assert rows_of(t, 2) == [0]
    assert 0 not in rows_of(t, 1, 3, 4)


def test_ids_of_the_current_step_are_never_evicted_and_extra_ids_wait() -> None:
    t = table(rows=3)  # 2 rows for ids
    t.update(ids(5, 6, 7))  # three new ids, two rows: the smallest two get them
    assert rows_of(t, 5, 6, 7) == [*list(rows_of(t, 5, 6)), 0]
    t.update(ids(5, 6, 7))  # 5 and 6 are in this step too: 7 still waits
    assert rows_of(t, 7) == [0]
    check_consistent(t)


def test_memory_is_bounded_while_distinct_ids_grow_tenfold() -> None:
    t = table(rows=64, min_count=2, ttl=5)
    before = {name: (b.shape, b.dtype) for name, b in t.named_buffers()}
    total = sum(b.numel() * b.element_size() for b in t.buffers())
    g = torch.Generator().manual_seed(0)
    for step in range(40):  # 40 x 16 fresh ids, each twice: 640 = 10x the rows
        fresh = torch.arange(16) + 16 * step + 10**12
        t.update(torch.cat([fresh, fresh, torch.randint(0, 10, (8,), generator=g)]))
        if step % 10 == 0:
            check_consistent(t)
    after = {name: (b.shape, b.dtype) for name, b in t.named_buffers()}
    assert after == before
    assert sum(b.numel() * b.element_size() for b in t.buffers()) == total
    assert int(t.occupied()) <= 63
    assert 0 not in rows_of(t, *range(10**12 + 16 * 39, 10**12 + 16 * 40))  # the newest ids


def test_eval_mode_only_looks_up() -> None:
    model = _model()
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model(_batch(0))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.lists(st.integers(min_value=-3, max_value=40), min_size=0, max_size=12),
        min_size=1,
        max_size=8,
    ),
    rows=st.integers(min_value=2, max_value=10),
    min_count=st.integers(min_value=1, max_value=3),
    ttl=st.one_of(st.none(), st.integers(min_value=1, max_value=3)),
    eviction=st.sampled_from(["lru", "lfu"]),
)
def test_any_sequence_of_updates_keeps_a_consistent_mapping(
    steps: list[list[int]], rows: int, min_count: int, ttl: int | None, eviction: str
) -> None:
    t = table(rows=rows, min_count=min_count, ttl=ttl, eviction=eviction)
    twin = table(rows=rows, min_count=min_count, ttl=ttl, eviction=eviction)
    for values in steps:
        batch = torch.tensor(values, dtype=torch.long)
        t.update(batch)
        # The mapping is a function of the step's ids as a multiset: any order, same state.
        twin.update(batch.flip(0))
        check_consistent(t)
        assert int(t.occupied()) <= rows - 1
        distinct = set(values)
        if min_count == 1 and len(distinct) <= rows - 1:
            assert 0 not in rows_of(t, *distinct)  # everything of this step fit
    # The saved state (the lookup index is derived: where free rows sit in it is no state).
    for name, buffer in t.state_dict().items():
        assert torch.equal(buffer, twin.state_dict()[name]), name


def test_initial_rows_are_a_function_of_the_id() -> None:
    a = initial_rows(ids(1, 2, 3), 8, 0.01)
    b = initial_rows(ids(3, 2, 1), 8, 0.01)
    assert torch.equal(a, b.flip(0))
    assert a.abs().max() <= 0.01 * 3**0.5
    assert a.std() > 0.003
    assert not torch.equal(a[0], a[1])


# -- the model ---------------------------------------------------------------------------------


def _config() -> ModelConfig:
    item = EmbeddingConfig("item", rows=16, min_count=1, ttl=4)
    return ModelConfig(
        name="deepfm",
        embedding_dim=4,
        hidden=(8,),
        max_embedding_rows=1000,
        embeddings=(item,),
    )


def _model(seed: int = 0) -> CTRModel:
    torch.manual_seed(seed)
    return build_model(_config(), LAYOUT)


def _batch(step: int, size: int = 32, rank: int = 0) -> dict[str, torch.Tensor]:
    """Items drifting over steps (new ones keep coming), users hashed; a learnable label."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    item = torch.randint(0, 12, (size,), generator=g) + 3 * step + 10**15
    user = torch.randint(0, 1 << 40, (size,), generator=g)
    user[:2] = NULL_ID
    return {
        "dense": torch.randn(size, 1, generator=g),
        "sparse": torch.randint(0, 5, (size, 1), generator=g),
        "ids": torch.stack([item, user], dim=1),
        "label": (item % 3 == 0).float(),
    }


def _train(model: CTRModel, optimizer: torch.optim.Optimizer, steps: range) -> None:
    model.train()
    for step in steps:
        batch = _batch(step)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch), batch["label"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        model.reset_new_rows(optimizer)
        optimizer.step()


def _state(model: CTRModel) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_model_learns_on_raw_ids_and_its_tables_stay_bounded() -> None:
    model = _model()
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    _train(model, optimizer, range(30))  # 30 steps x 3 new items: 100 items for 15 rows
    assert {k: v.shape for k, v in model.state_dict().items()} == shapes
    assert model.id_tables is not None
    item = model.id_tables.tables["item"]
    assert isinstance(item, DynamicTable)
    assert 0 < int(item.occupied()) <= 15
    model.eval()
    with torch.no_grad():
        logits = model(_batch(29))
    assert torch.isfinite(logits).all()


def test_a_reused_row_starts_afresh_with_no_optimizer_state() -> None:
    config = ModelConfig(
        name="wide_deep",
        embedding_dim=4,
        hidden=(4,),
        embeddings=(EmbeddingConfig("item", rows=2),),  # one row: every new id takes it over
    )
    layout_ = Layout(dense=("price",), sparse=(), sequences=(), ids=("item",))
    model = build_model(config, layout_)
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.1)
    for item in (7, 8):
        batch = {"dense": torch.ones(4, 1), "ids": torch.full((4, 1), item), "label": torch.ones(4)}
        logits = model(batch)
        model.reset_new_rows(optimizer)
        row = model.embeddings.weight[1]
        assert torch.equal(row.detach(), initial_rows(ids(item), 4, 0.01, salt=0)[0])
        if item == 8:  # the row held 7 and had Adagrad sums; they are gone
            sums = optimizer.state[model.embeddings.weight]["sum"]
            assert float(sums[1].abs().sum()) == 0
            assert model.embeddings.weight.detach()[0].abs().sum() > 0  # row 0 untouched
        optimizer.zero_grad()
        logits.sum().backward()
        optimizer.step()


def test_the_fixed_shape_path_a_gpu_takes_writes_what_the_compacted_one_does() -> None:
    compacted, fixed = _model(), _model()
    assert fixed.id_tables is not None
    fixed.id_tables.compact = False
    for model in (compacted, fixed):
        _train(model, torch.optim.Adagrad(model.parameters(), lr=0.05), range(10))
    expected, got = _state(compacted), _state(fixed)
    for name in expected:
        assert torch.equal(expected[name], got[name]), name


def test_exact_resume_equals_an_uninterrupted_run() -> None:
    whole = _model()
    whole_opt = torch.optim.Adagrad(whole.parameters(), lr=0.05)
    _train(whole, whole_opt, range(12))

    first = _model()
    first_opt = torch.optim.Adagrad(first.parameters(), lr=0.05)
    _train(first, first_opt, range(6))
    saved = io.BytesIO()
    torch.save({"model": first.state_dict(), "optimizer": first_opt.state_dict()}, saved)
    saved.seek(0)
    checkpoint = torch.load(saved, weights_only=True)
    resumed = _model(seed=99)  # other initial weights: the checkpoint must replace them all
    resumed_opt = torch.optim.Adagrad(resumed.parameters(), lr=0.05)
    resumed.load_state_dict(checkpoint["model"])
    resumed_opt.load_state_dict(checkpoint["optimizer"])
    _train(resumed, resumed_opt, range(6, 12))

    expected, got = _state(whole), _state(resumed)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name


def test_the_exported_model_scores_raw_ids_with_its_mapping() -> None:
    model = _model()
    _train(model, torch.optim.Adagrad(model.parameters(), lr=0.05), range(5))
    # What trainers.export saves and CTRPredictor rebuilds: config as a dict, layout, state.
    saved = {
        "state": model.state_dict(),
        "config": asdict(model.config),
        "layout": LAYOUT.to_dict(),
    }
    rebuilt = build_model(ModelConfig(**saved["config"]), Layout.from_dict(saved["layout"]))
    rebuilt.load_state_dict(saved["state"])
    model.eval()
    rebuilt.eval()
    with torch.no_grad():
        assert torch.equal(model(_batch(4)), rebuilt(_batch(4)))


# -- declared in the spec and the config -------------------------------------------------------


def test_an_id_feature_reaches_the_layout_and_back() -> None:
    spec = FeatureSpec(
        name="s", features=(Hashed("country", buckets=8), Id("item_id"), Id("user_id"))
    )
    built = layout(spec, None)
    assert built.ids == ("item_id", "user_id")
    assert Layout.from_dict(built.to_dict()) == built
    plain = Layout(dense=(), sparse=(("c", 3),), sequences=())
    assert "ids" not in plain.to_dict()  # layouts recorded before Id features still compare


@pytest.mark.parametrize(
    ("settings_", "message"),
    [
        ({"rows": 1}, "rows=1"),
        ({"min_count": 0}, "min_count=0"),
        ({"ttl": 0}, "ttl=0"),
        ({"eviction": "fifo"}, "eviction='fifo'"),
        ({"kind": "hashed", "ttl": 5}, "ttl apply to kind='dynamic' only"),
    ],
)
def test_embedding_config_errors_name_the_field(settings_: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EmbeddingConfig("item", **settings_)  # type: ignore[arg-type]


def test_a_table_for_a_feature_that_is_no_id_says_what_to_change() -> None:
    with pytest.raises(ConfigError, match=r"declare it Id\('country'\)"):
        build_model(ModelConfig(embeddings=(EmbeddingConfig("country"),)), LAYOUT)
    with pytest.raises(ConfigError, match="no Id feature of the channel's layout"):
        build_model(ModelConfig(embeddings=(EmbeddingConfig("itme"),)), LAYOUT)
    with pytest.raises(ConfigError, match="two entries"):
        ModelConfig(embeddings=(EmbeddingConfig("item"), EmbeddingConfig("item", rows=4)))


def test_an_id_feature_without_an_entry_is_hashed_by_the_trainer() -> None:
    model = build_model(ModelConfig(embedding_dim=4, max_embedding_rows=100), LAYOUT)
    assert model.id_tables is not None
    assert model.id_tables.rows == (100, 100)
    rows = model.id_tables(_batch(0), update=True)
    assert rows.min() >= 0
    assert rows.max() < 100
    assert (rows[:2, 1] == 0).all()  # null users


# -- DDP and CUDA --------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ddp_rank(rank: int, world: int, port: int, folder: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = _model()
        net = DistributedDataParallel(model, broadcast_buffers=False)
        optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)
        for step in range(6):
            batch = _batch(step, size=16 + 4 * rank, rank=rank)  # other ids, other sizes
            loss = torch.nn.functional.binary_cross_entropy_with_logits(net(batch), batch["label"])
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            model.reset_new_rows(optimizer)
            optimizer.step()
        torch.save(_state(model), Path(folder) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ddp_ranks_keep_the_same_mapping_and_weights() -> None:
    from torch.multiprocessing.spawn import spawn

    with tempfile.TemporaryDirectory() as folder:
        spawn(  # type: ignore[no-untyped-call]
            _ddp_rank, args=(2, _free_port(), folder), nprocs=2, join=True
        )
        states = [torch.load(Path(folder) / f"rank{r}.pt") for r in range(2)]
    keys = states[0]["id_tables.tables.item.keys"]
    assert int((keys != FREE).sum()) > 0
    for name, value in states[0].items():
        assert torch.equal(value, states[1][name]), name
    # Rank 1's ids were admitted on rank 0 too: the update saw every rank's ids.
    reference = table(rows=16, ttl=4)
    for step in range(6):
        both = [_batch(step, size=16 + 4 * r, rank=r)["ids"][:, 0] for r in range(2)]
        reference.update(torch.cat(both))
    assert torch.equal(reference.keys, keys)


@CUDA
def test_the_mapping_is_the_same_on_cuda_as_on_the_cpu() -> None:
    cpu, gpu = table(rows=32, min_count=2, ttl=3), table(rows=32, min_count=2, ttl=3).cuda()
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        batch = torch.randint(0, 80, (64,), generator=g) * 7919 + 2**40
        cpu.update(batch)
        gpu.update(batch.cuda())
        probe = torch.randint(0, 80, (32,), generator=g) * 7919 + 2**40
        assert torch.equal(cpu.lookup(probe), gpu.lookup(probe.cuda()).cpu())
    for name, buffer in cpu.state_dict().items():
        assert torch.equal(buffer, gpu.state_dict()[name].cpu()), name


@CUDA
def test_a_model_trains_on_cuda_and_matches_the_cpu_mapping() -> None:
    cpu = _model()
    gpu = _model().cuda()
    cpu_opt = torch.optim.Adagrad(cpu.parameters(), lr=0.05)
    gpu_opt = torch.optim.Adagrad(gpu.parameters(), lr=0.05)
    for step in range(8):
        for model, optimizer in ((cpu, cpu_opt), (gpu, gpu_opt)):
            device = next(model.parameters()).device
            batch = {k: v.to(device) for k, v in _batch(step).items()}
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                model(batch), batch["label"]
            )
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            model.reset_new_rows(optimizer)
            optimizer.step()
    assert cpu.id_tables is not None
    assert gpu.id_tables is not None
    for name, buffer in cpu.id_tables.state_dict().items():
        assert torch.equal(buffer, gpu.id_tables.state_dict()[name].cpu()), name
    # Weights agree up to float differences; Adagrad's first step (about lr x the gradient's
    # sign) may turn a near-zero gradient's rounding into a full step on a few entries.
    differs = (cpu.embeddings.weight - gpu.embeddings.weight.cpu()).abs() > 1e-3
    assert float(differs.float().mean()) < 0.01
