"""CTR models: they read the handoff batch contract, train, and say what is wrong with a batch."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from flow.errors import ConfigError, SchemaMismatchError
from flow.pipeline.state import Layout
from flow.training import ModelConfig
from trainers.metrics import binary_auc
from trainers.models import CTRModel, FieldEmbeddings, build_model

NAMES = ["deepfm", "dlrm", "wide_deep"]

LAYOUT = Layout(
    dense=("age", "price", "hour"),
    sparse=(("country", 7), ("device", 3), ("item", 500)),
    sequences=(("history", 500, 5),),
)
NO_DENSE = Layout(dense=(), sparse=(("country", 7), ("item", 50)), sequences=(("history", 50, 4),))
LAYOUTS = {"with_dense": LAYOUT, "no_dense": NO_DENSE}


def random_batch(layout: Layout, size: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    """A batch as the handoff delivers it, with some sequence padding."""
    g = torch.Generator().manual_seed(seed)
    batch = {"label": torch.randint(0, 2, (size,), generator=g).float()}
    if layout.dense:
        batch["dense"] = torch.randn(size, len(layout.dense), generator=g)
    if layout.sparse:
        batch["sparse"] = torch.stack(
            [torch.randint(0, c, (size,), generator=g) for _, c in layout.sparse], dim=1
        )
    for name, cardinality, length in layout.sequences:
        ids = torch.randint(1, cardinality, (size, length), generator=g)
        keep = torch.rand(size, length, generator=g) < 0.6
        batch[f"seq_{name}"] = ids * keep
    return batch


def read_only(tensor: torch.Tensor) -> torch.Tensor:
    """A view of a read-only buffer, as the handoff reader gives."""
    array = tensor.numpy().copy()
    array.setflags(write=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def model(name: str, layout: Layout = LAYOUT, **config: object) -> CTRModel:
    torch.manual_seed(0)
    return build_model(ModelConfig(name, hidden=(32, 16), bottom=(8,), **config), layout)  # type: ignore[arg-type]


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
@pytest.mark.parametrize("name", NAMES)
def test_forward_gives_a_logit_per_row_and_backward_reaches_every_parameter(name, layout):
    m = model(name, layout)
    logits = m(random_batch(layout, size=16))
    assert logits.shape == (16,)
    assert logits.dtype == torch.float32
    loss = F.binary_cross_entropy_with_logits(logits, random_batch(layout)["label"])
    loss.backward()  # type: ignore[no-untyped-call]
    no_gradient = [n for n, p in m.named_parameters() if p.grad is None or not p.grad.any()]
    assert no_gradient == []
    assert m.embedding_parameters()
    assert m.dense_parameters()


@pytest.mark.parametrize("name", NAMES)
def test_embedding_and_dense_parameters_split_the_model(name):
    m = model(name)
    embedding = {id(p) for p in m.embedding_parameters()}
    dense = {id(p) for p in m.dense_parameters()}
    assert not embedding & dense
    assert embedding | dense == {id(p) for p in m.parameters()}
    # The tables are the parameters with a row per id.
    rows = sum(min(c, 2**22) for _, c in LAYOUT.sparse) + sum(c for _, c, _ in LAYOUT.sequences)
    assert all(p.shape[0] == rows for p in m.embedding_parameters())


@pytest.mark.parametrize("name", NAMES)
def test_int32_indices_and_read_only_inputs_give_the_same_logits(name):
    m = model(name).eval()
    batch = random_batch(LAYOUT)
    narrow = {k: v.int() if not v.is_floating_point() else v for k, v in batch.items()}
    narrow = {k: read_only(v) for k, v in narrow.items()}
    frozen = {k: v.clone() for k, v in narrow.items()}
    torch.testing.assert_close(m(narrow), m(batch))
    for key, tensor in narrow.items():
        assert torch.equal(tensor, frozen[key]), f"{key} was modified"


@pytest.mark.parametrize("name", NAMES)
def test_sequence_order_and_padding_do_not_matter(name):
    m = model(name).eval()
    batch = random_batch(LAYOUT, size=2)
    batch["seq_history"] = torch.tensor([[4, 9, 0, 0, 0], [0, 0, 0, 0, 0]])
    moved = dict(batch, seq_history=torch.tensor([[0, 9, 0, 0, 4], [0, 0, 0, 0, 0]]))
    torch.testing.assert_close(m(moved), m(batch))


def test_a_sequence_is_the_mean_of_its_ids_and_all_padding_is_zero():
    table = FieldEmbeddings(Layout((), (), (("history", 10, 4),)), dim=3, max_rows=100)
    ids = torch.tensor([[2, 0, 5, 2], [0, 0, 0, 0]])
    pooled = table({"seq_history": ids})
    vectors = table.weight.detach()
    torch.testing.assert_close(pooled[0, 0], (2 * vectors[2] + vectors[5]) / 3)
    assert torch.equal(pooled[1, 0], torch.zeros(3))


def test_a_feature_larger_than_max_rows_is_hashed_into_its_own_rows():
    layout = Layout((), (("small", 4), ("huge", 10**12)), ())
    table = FieldEmbeddings(layout, dim=2, max_rows=100)
    assert table.weight.shape == (4 + 100, 2)
    vectors = table({"sparse": torch.tensor([[1, 10**12 - 1], [1, 10**12 - 1 - 100 * 7]])})
    torch.testing.assert_close(vectors[0], vectors[1])  # same row: equal modulo 100
    torch.testing.assert_close(vectors[0, 1], table.weight[4 + (10**12 - 1) % 100])


@pytest.mark.parametrize("name", NAMES)
def test_runs_under_bf16_autocast(name):
    m = model(name)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = m(random_batch(LAYOUT))
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny tensors gain nothing from threads, and on a busy machine they wait on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name", NAMES)
def test_learns_a_planted_signal(name):
    """Clicks depend on one id, one dense value and one id in the history: AUC well above 0.7."""
    layout = Layout(("signal", "noise"), (("item", 20), ("noise", 30)), (("history", 40, 6),))
    g = torch.Generator().manual_seed(1)

    def draw(size: int) -> dict[str, torch.Tensor]:
        batch = random_batch(layout, size, seed=int(torch.randint(0, 2**31, (1,), generator=g)))
        score = (
            2.0 * (batch["sparse"][:, 0] % 2 == 0).float()
            + 1.5 * batch["dense"][:, 0]
            + 2.0 * (batch["seq_history"] == 7).any(dim=1).float()
            - 2.0
        )
        batch["label"] = (torch.rand(size, generator=g) < torch.sigmoid(2 * score)).float()
        return batch

    m = model(name, layout)
    optimizer = torch.optim.Adam(m.parameters(), lr=1e-2)
    for _ in range(150):
        batch = draw(256)
        loss = F.binary_cross_entropy_with_logits(m(batch), batch["label"])
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    test = draw(4000)
    with torch.no_grad():
        auc = binary_auc(m.eval()(test).numpy(), test["label"].numpy())
    assert auc > 0.9  # the Bayes rate is 0.946; an untrained model can start near 0.8


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: b.pop("sparse"), "no column 'sparse'"),
        (lambda b: b.pop("dense"), "no column 'dense'"),
        (lambda b: b.pop("seq_history"), "no column 'seq_history'"),
        (
            lambda b: b.update(sparse=b["sparse"][:, :2]),
            r"'sparse' has shape \(16, 2\).*\[batch, 3\]",
        ),
        (lambda b: b.update(dense=b["dense"][:, :1]), r"'dense' has shape \(16, 1\).*\[batch, 3\]"),
        (lambda b: b.update(seq_history=b["seq_history"][:, :3]), r"\[batch, 5\]"),
        (lambda b: b.update(sparse=b["sparse"].float()), "expected int64 or int32"),
        (lambda b: b.update(dense=b["dense"][:8]), "different numbers of rows: dense 8, sparse 16"),
    ],
)
def test_a_batch_that_does_not_fit_the_layout_is_named(change, message):
    batch = random_batch(LAYOUT)
    change(batch)
    with pytest.raises(SchemaMismatchError, match=message):
        model("deepfm")(batch)


def test_out_of_range_indices_are_found_on_request():
    m = model("dlrm")
    batch = random_batch(LAYOUT)
    m.check_indices(batch)
    batch["sparse"] = batch["sparse"].clone()
    batch["sparse"][3, 1] = 3  # device has cardinality 3
    with pytest.raises(SchemaMismatchError, match="device"):
        m.check_indices(batch)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "fm"}, "ModelConfig.name is 'fm'; choose one of deepfm, dlrm, wide_deep"),
        ({"embedding_dim": 0}, "ModelConfig.embedding_dim"),
        ({"hidden": (32, 0)}, "ModelConfig.hidden"),
        ({"bottom": (-1,)}, "ModelConfig.bottom"),
        ({"max_embedding_rows": 0}, "ModelConfig.max_embedding_rows"),
        ({"dropout": 1.0}, "ModelConfig.dropout"),
    ],
)
def test_config_names_the_field_to_change(fields, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**{"name": "deepfm", **fields})


def test_config_takes_lists_as_tuples():
    config = ModelConfig("dlrm", hidden=[8, 4], bottom=[2])  # type: ignore[arg-type]
    assert config.hidden == (8, 4)
    assert config.bottom == (2,)
    hash(config)


def test_layouts_a_model_cannot_use_are_refused():
    with pytest.raises(ConfigError, match="no features"):
        build_model(ModelConfig("deepfm"), Layout((), (), ()))
    with pytest.raises(ConfigError, match="dlrm needs"):
        build_model(ModelConfig("dlrm"), Layout((), (("only", 5),), ()))


@pytest.mark.parametrize("name", NAMES)
def test_traces_into_one_graph_for_torch_compile(name):
    torch._dynamo.reset()
    m = model(name)
    compiled = torch.compile(m, backend="eager", fullgraph=True)
    batch = random_batch(LAYOUT)
    torch.testing.assert_close(compiled(batch), m(batch))
