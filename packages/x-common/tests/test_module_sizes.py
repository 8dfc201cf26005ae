"""module_sizes: bytes per module, hand-computed, with shared tensors counted once."""

from __future__ import annotations

from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from x_common.module_sizes import module_sizes, named_tensors, tensor_key  # noqa: E402


def linear_stack() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


def tied_pair() -> nn.Module:
    emb = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    return nn.ModuleDict({"emb": emb, "head": head})


def batch_norm() -> nn.Module:
    return nn.BatchNorm1d(4)


def small_transformer() -> nn.Module:
    return nn.Transformer(
        d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=16, batch_first=True
    )


class TinyLM(nn.Module):
    """Embedding, two encoder layers, final norm and an LM head tied to the embedding."""

    def __init__(self, vocab: int = 100, d_model: int = 16, layers: int = 2, nhead: int = 2, d_ff: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, nhead, d_ff, dropout=0.0, batch_first=True) for _ in range(layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.embed.weight


# TinyLM by hand, d=16, ff=32, float32:
#   attention: in_proj 3*16*16 + 3*16, out_proj 16*16 + 16       = 1088 params
#   feed-forward: 32*16 + 32 and 16*32 + 16                       = 1072
#   two LayerNorms: 2 * (16 + 16)                                 =   64
LAYER_PARAMS = 1088 + 1072 + 64  # 2224
EMBED_PARAMS = 100 * 16  # 1600, shared with the head
TINY_LM_PARAMS = EMBED_PARAMS + 2 * LAYER_PARAMS + 2 * 16  # 6080


def test_linear_stack_by_hand() -> None:
    assert module_sizes(linear_stack()) == {
        "": 92,
        "0": 60,
        "0.weight": 48,
        "0.bias": 12,
        "2": 32,
        "2.weight": 24,
        "2.bias": 8,
    }


def test_tied_weight_counted_once_at_root_and_fully_in_each_holder() -> None:
    assert module_sizes(tied_pair()) == {
        "": 160,
        "emb": 160,
        "emb.weight": 160,
        "head": 160,
        "head.weight": 160,
    }


def test_shared_submodule_counted_once() -> None:
    shared = nn.Linear(2, 2)  # 6 floats, 24 bytes
    root = nn.Module()
    root.a = shared
    root.b = shared
    assert module_sizes(root) == {"": 24, "a": 24, "a.weight": 16, "a.bias": 8, "b": 24, "b.weight": 16, "b.bias": 8}


def test_distinct_parameters_over_one_storage_counted_once() -> None:
    memory = torch.zeros(5, 5)
    a = nn.Linear(5, 5, bias=False)
    b = nn.Linear(5, 5, bias=False)
    a.weight = nn.Parameter(memory)
    b.weight = nn.Parameter(memory)
    assert a.weight is not b.weight
    assert a.weight.data_ptr() == b.weight.data_ptr()
    sizes = module_sizes(nn.ModuleDict({"a": a, "b": b}))
    assert sizes[""] == 100
    assert sizes["a"] == sizes["b"] == 100


def test_disjoint_views_of_one_storage_counted_separately() -> None:
    memory = torch.zeros(10)
    root = nn.Module()
    root.first = nn.Parameter(memory[:5])
    root.second = nn.Parameter(memory[5:])
    assert module_sizes(root) == {"": 40, "first": 20, "second": 20}


def test_buffers_included_and_excluded() -> None:
    # weight, bias, running_mean, running_var: 4 floats each; num_batches_tracked: one int64
    assert module_sizes(batch_norm()) == {
        "": 72,
        "weight": 16,
        "bias": 16,
        "running_mean": 16,
        "running_var": 16,
        "num_batches_tracked": 8,
    }
    assert module_sizes(batch_norm(), include_buffers=False) == {"": 32, "weight": 16, "bias": 16}


def test_non_persistent_and_none_buffers() -> None:
    module = nn.Module()
    module.register_buffer("cache", torch.zeros(3), persistent=False)
    module.register_buffer("absent", None)
    assert module_sizes(module) == {"": 12, "cache": 12}


@pytest.mark.parametrize(
    ("dtype", "expected_root"),
    [
        ("float16", 4 * 8 + 8),  # floats halve, the int64 counter keeps its 8 bytes
        (torch.float16, 4 * 8 + 8),
        ("bf16", 4 * 8 + 8),
        ("float64", 4 * 32 + 8),
        ("int4", 4 * 2 + 8),  # 4 values of 4 bits: 2 bytes per tensor
        ("float32", 72),
    ],
)
def test_dtype_converts_floats_only(dtype: object, expected_root: int) -> None:
    sizes = module_sizes(batch_norm(), dtype)
    assert sizes[""] == expected_root
    assert sizes["num_batches_tracked"] == 8


def test_bool_and_integer_buffers_keep_their_size() -> None:
    module = nn.Module()
    module.register_buffer("mask", torch.ones(10, dtype=torch.bool))
    module.register_buffer("ids", torch.arange(5, dtype=torch.int32))
    module.weight = nn.Parameter(torch.zeros(6))
    for dtype in (None, "float16", "int4"):
        sizes = module_sizes(module, dtype)
        assert sizes["mask"] == 10
        assert sizes["ids"] == 20
    assert module_sizes(module)["weight"] == 24
    assert module_sizes(module, "float16")["weight"] == 12
    assert module_sizes(module, "int4")["weight"] == 3


def test_int4_rounds_up_per_tensor() -> None:
    # weight: 3 values (12 bits -> 2 bytes); bias: 1 value (4 bits -> 1 byte)
    assert module_sizes(nn.Linear(3, 1), "int4") == {"": 3, "weight": 2, "bias": 1}


def test_tied_weight_with_dtype() -> None:
    assert module_sizes(tied_pair(), "fp16") == {"": 80, "emb": 80, "emb.weight": 80, "head": 80, "head.weight": 80}


def test_unknown_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^unknown dtype 'float17'; accepted names: "):
        module_sizes(linear_stack(), "float17")


@pytest.mark.parametrize("module", [nn.Module(), nn.ReLU(), nn.Sequential(), nn.ModuleDict()])
def test_module_without_tensors(module: nn.Module) -> None:
    assert module_sizes(module) == {"": 0}


def test_tiny_lm_by_hand() -> None:
    model = TinyLM()
    sizes = module_sizes(model)
    assert sizes[""] == TINY_LM_PARAMS * 4 == 24320
    assert sizes["embed"] == sizes["head"] == sizes["head.weight"] == EMBED_PARAMS * 4
    assert sizes["layers"] == 2 * LAYER_PARAMS * 4
    assert sizes["layers.0"] == sizes["layers.1"] == LAYER_PARAMS * 4
    assert sizes["layers.0.self_attn"] == 1088 * 4
    assert sizes["layers.0.self_attn.in_proj_weight"] == 3 * 16 * 16 * 4
    assert sizes["layers.1.linear1"] == (32 * 16 + 32) * 4
    assert sizes["norm"] == 32 * 4
    # torch's own de-duplicated count agrees
    assert sizes[""] == sum(p.numel() * p.element_size() for p in model.parameters())
    assert module_sizes(model, "bf16")[""] == TINY_LM_PARAMS * 2


def test_every_prefix_of_every_name_is_a_key() -> None:
    model = TinyLM()
    sizes = module_sizes(model)
    expected = {""}
    for name, _ in model.named_parameters(remove_duplicate=False):
        parts = name.split(".")
        expected.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    assert set(sizes) == expected


def test_full_transformer_matches_torch_parameter_count() -> None:
    model = small_transformer()
    sizes = module_sizes(model)
    assert sizes[""] == sum(p.numel() * 4 for p in model.parameters())
    assert sizes[""] == sizes["encoder"] + sizes["decoder"]


@pytest.mark.parametrize(
    "build",
    [linear_stack, tied_pair, batch_norm, TinyLM, small_transformer],
    ids=["linear_stack", "tied_pair", "batch_norm", "tiny_lm", "transformer"],
)
@pytest.mark.parametrize("dtype", [None, "float16", "int4"])
@pytest.mark.parametrize("include_buffers", [True, False])
def test_meta_device_gives_cpu_numbers(
    build: Callable[[], nn.Module], dtype: str | None, include_buffers: bool
) -> None:
    cpu = build()
    with torch.device("meta"):
        meta = build()
    assert all(t.device.type == "meta" for _, t in named_tensors(meta))
    assert module_sizes(meta, dtype, include_buffers=include_buffers) == module_sizes(
        cpu, dtype, include_buffers=include_buffers
    )


def test_tensor_key() -> None:
    memory = torch.zeros(4, 4)
    assert tensor_key(memory) == tensor_key(nn.Parameter(memory))
    assert tensor_key(memory) != tensor_key(memory[1:])
    assert tensor_key(memory) != tensor_key(memory.t())
    assert tensor_key(memory) != tensor_key(torch.zeros(4, 4))
    meta = torch.empty(4, 4, device="meta")
    assert tensor_key(meta) == ("meta", id(meta))
    assert tensor_key(meta) != tensor_key(torch.empty(4, 4, device="meta"))


def test_named_tensors_keeps_duplicates() -> None:
    names = [name for name, _ in named_tensors(tied_pair())]
    assert names == ["emb.weight", "head.weight"]
    assert [name for name, _ in named_tensors(batch_norm(), include_buffers=False)] == ["weight", "bias"]
    assert [name for name, _ in named_tensors(batch_norm())] == [
        "weight",
        "bias",
        "running_mean",
        "running_var",
        "num_batches_tracked",
    ]


def test_tensor_infos_describe_each_tensor_once_with_all_names() -> None:
    from x_common.module_sizes import tensor_infos

    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"emb": emb, "head": head, "norm": torch.nn.BatchNorm1d(4)})
    model["norm"].weight.requires_grad_(False)
    infos = {info.names[0]: info for info in tensor_infos(model)}
    assert infos["emb.weight"].names == ("emb.weight", "head.weight")
    assert infos["emb.weight"].shape == (10, 4) and infos["emb.weight"].dtype == "float32"
    assert infos["emb.weight"].is_parameter and infos["emb.weight"].requires_grad
    assert infos["norm.weight"].requires_grad is False
    assert infos["norm.num_batches_tracked"].dtype == "int64" and not infos["norm.num_batches_tracked"].is_parameter
    assert len(infos) == 6  # emb/head weight once, norm weight, bias, running_mean, running_var, num_batches_tracked


def test_sizes_of_recomputes_from_plain_data_in_other_dtypes() -> None:
    from x_common.module_sizes import TensorInfo, sizes_of

    tensors = [
        TensorInfo(("a.w", "b.w"), (100, 10), "float32"),
        TensorInfo(("a.steps",), (3,), "int64", is_parameter=False),
    ]
    assert sizes_of(tensors) == {"": 4024, "a": 4024, "a.w": 4000, "a.steps": 24, "b": 4000, "b.w": 4000}
    assert sizes_of(tensors, "int4")[""] == 500 + 24  # integers keep their size
    with pytest.raises(ValueError, match="unknown dtype 'float31'"):
        sizes_of(tensors, "float31")
