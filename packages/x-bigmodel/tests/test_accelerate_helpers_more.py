"""More of Accelerate's big-model helpers on x, side by side with Accelerate's own (1.15, installed
beside): the largest layer, memory budgets given by the caller, ``CustomDtype`` sizes, the offload
folder's index and its loading, and a device map taken as given when ``check_device_map`` is
replaced (as transformers replaces it)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import MappingProxyType

import accelerate
import accelerate.big_modeling
import pytest
import torch
from accelerate.utils import CustomDtype as TheirCustomDtype
from accelerate.utils import modeling as theirs
from accelerate.utils import offload as their_offload
from torch import nn

import x_bigmodel as ours
from x_bigmodel.planning import device_map as planning

transformers = pytest.importorskip("transformers")


def _llama() -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def _bert() -> nn.Module:
    config = transformers.BertConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64,
    )  # fmt: skip
    return transformers.BertModel(config)


def _t5() -> nn.Module:
    config = transformers.T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    return transformers.T5ForConditionalGeneration(config)  # embeddings tied three ways


MODELS = {"llama": (_llama, "LlamaDecoderLayer"), "bert": (_bert, "BertLayer"), "t5": (_t5, "T5Block")}


@pytest.fixture(scope="module")
def models() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    return {name: build() for name, (build, _) in MODELS.items()}


# ---------------------------------------------------------------------------------------------
# get_max_layer_size


@pytest.mark.parametrize("sizes_from", ["ours", "theirs"])
@pytest.mark.parametrize("split", [False, True], ids=["split", "no_split"])
@pytest.mark.parametrize("name", list(MODELS))
def test_max_layer_size_matches_accelerate_on_transformers_models(models, name: str, split: bool, sizes_from) -> None:
    model = models[name]
    no_split = [MODELS[name][1]] if split else []
    sizes = (ours if sizes_from == "ours" else theirs).compute_module_sizes(model)
    # What transformers' planner hands it: the root's own tensors, then its children.
    modules = [*model.named_parameters(recurse=False), *model.named_children(), *model.named_buffers(recurse=False)]
    given = list(modules)
    got = ours.get_max_layer_size(modules, sizes, no_split)
    assert got == theirs.get_max_layer_size(list(modules), sizes, no_split)
    assert modules == given  # the caller's list is not consumed
    size, names = got
    assert size > 0 and names
    if split:
        # the no-split blocks are the largest layers of these models, all of one size
        assert all(type(model.get_submodule(n)).__name__ == no_split[0] for n in names)
    # transformers asks again with the modules left to place: the same answer as Accelerate's
    rest = [(n, m) for n, m in modules[1:] if isinstance(m, nn.Module)]
    assert ours.get_max_layer_size(rest, sizes, no_split) == theirs.get_max_layer_size(rest, sizes, no_split)


def test_max_layer_size_with_root_tensors_ties_and_half_precision() -> None:
    class WithScale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(300))  # a tensor of the root: a "layer" of its own
            self.embed = nn.Embedding(10, 8)
            self.blocks = nn.Sequential(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), nn.Linear(8, 8))
            self.head = nn.Linear(8, 10, bias=False)
            self.head.weight = self.embed.weight  # counted in its first holder only
            self.register_buffer("mask", torch.ones(40, dtype=torch.bool))

    model = WithScale().half()
    for dtype in (None, torch.float32, "bfloat16"):
        sizes = ours.compute_module_sizes(model, dtype=dtype)
        assert dict(sizes) == dict(theirs.compute_module_sizes(model, dtype=dtype))
        modules = [*model.named_parameters(recurse=False), *model.named_children(), *model.named_buffers(recurse=False)]
        for no_split in ([], ["Sequential"], ["WithScale"]):
            assert ours.get_max_layer_size(modules, sizes, no_split) == theirs.get_max_layer_size(
                modules, sizes, no_split
            )
    sizes = ours.compute_module_sizes(model)
    assert ours.get_max_layer_size([("", model)], sizes, ["WithScale"]) == (sizes[""], [""])
    assert ours.get_max_layer_size([], sizes, []) == theirs.get_max_layer_size([], sizes, []) == (0, [])


def test_max_layer_size_on_a_meta_model(tiny_llama) -> None:
    with ours.init_empty_weights():
        model = transformers.LlamaForCausalLM(tiny_llama)
    sizes = ours.compute_module_sizes(model, dtype=torch.float16)
    modules = list(model.named_children())
    got = ours.get_max_layer_size(modules, sizes, ["LlamaDecoderLayer"])
    assert got == theirs.get_max_layer_size(
        modules, theirs.compute_module_sizes(model, dtype=torch.float16), ["LlamaDecoderLayer"]
    )
    assert got[1] == [f"model.layers.{i}" for i in range(4)]


# ---------------------------------------------------------------------------------------------
# get_max_memory with a caller's dict


def test_get_max_memory_converts_the_callers_strings_in_place_as_accelerate(caplog) -> None:
    given = {"disk": "10GB", 1: "1GiB", "cpu": "2GiB", 0: 1024, "mps": "500MB"}
    ours_given, their_given = dict(given), dict(given)
    with caplog.at_level(logging.WARNING):
        got = ours.get_max_memory(ours_given)
        expected = accelerate.utils.get_max_memory(their_given)
    assert list(got.items()) == list(expected.items())  # values and filling order
    assert got == {0: 1024, 1: 2**30, "mps": 500 * 10**6, "cpu": 2 * 2**30, "disk": 10 * 10**9}
    # the caller's dict: its strings replaced by bytes, its keys and their order as written
    assert list(ours_given.items()) == list(their_given.items())
    assert ours_given == {"disk": 10 * 10**9, 1: 2**30, "cpu": 2 * 2**30, 0: 1024, "mps": 500 * 10**6}
    assert got is not ours_given
    # the dict returned is the caller's no more than Accelerate's is
    got["cpu"] = 1
    assert ours_given["cpu"] == 2 * 2**30


def test_get_max_memory_takes_float_byte_counts_as_transformers_passes_them() -> None:
    cpu = 0.9 * 2**30  # transformers keeps 90% of the CPU's: 966367641.6
    given = {"cpu": cpu, "disk": 0.0, 0: "1KiB"}
    ours_given, their_given = dict(given), dict(given)
    got = ours.get_max_memory(ours_given)
    expected = accelerate.utils.get_max_memory(their_given)
    assert list(got) == list(expected)
    # x gives whole bytes: the float rounded down; Accelerate keeps the float
    assert got == {0: 1024, "cpu": int(cpu), "disk": 0} == {k: int(v) for k, v in expected.items()}
    assert all(type(v) is int for v in got.values())
    # floats in the caller's dict are left as they are, as in Accelerate
    assert ours_given == their_given == {"cpu": cpu, "disk": 0.0, 0: 1024}
    assert isinstance(ours_given["cpu"], float)
    assert ours.get_max_memory({"cpu": 2048.0}) == {"cpu": 2048}


def test_get_max_memory_refuses_negative_floats_and_leaves_read_only_mappings_alone() -> None:
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="invalid size"):
            ours.get_max_memory({"cpu": bad})
    frozen = MappingProxyType({"cpu": "1KiB", "disk": "1MB"})
    assert ours.get_max_memory(frozen) == {"cpu": 1024, "disk": 10**6}
    assert dict(frozen) == {"cpu": "1KiB", "disk": "1MB"}


# ---------------------------------------------------------------------------------------------
# CustomDtype


def test_custom_dtype_names_and_byte_sizes_are_accelerates() -> None:
    assert [(d.name, d.value) for d in ours.CustomDtype] == [(d.name, d.value) for d in TheirCustomDtype]
    for name in ("FP8", "INT4", "INT2"):
        assert ours.dtype_byte_size(getattr(ours.CustomDtype, name)) == theirs.dtype_byte_size(
            getattr(TheirCustomDtype, name)
        )  # 1, 0.5, 0.25


@pytest.mark.parametrize("name", ["FP8", "INT4", "INT2"])
def test_compute_module_sizes_in_a_custom_dtype_counts_as_accelerate(name: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Embedding(6, 4))
    model.register_buffer("steps", torch.zeros(3, dtype=torch.int64))  # integer tensors keep their size
    expected = dict(theirs.compute_module_sizes(model, dtype=getattr(TheirCustomDtype, name)))
    assert dict(ours.compute_module_sizes(model, dtype=getattr(ours.CustomDtype, name))) == expected
    assert dict(ours.compute_module_sizes(model, dtype=getattr(TheirCustomDtype, name))) == expected


BUDGETS = [
    {"cpu": 60_000, "disk": 10**9},
    {0: 40_000, "cpu": 60_000, "disk": 10**9},
    {"cpu": 100_000, "disk": 10**9},
]


@pytest.mark.parametrize("budget", range(len(BUDGETS)))
@pytest.mark.parametrize("name", ["FP8", "INT4", "INT2"])
def test_infer_auto_device_map_in_a_custom_dtype_places_as_accelerate(tiny_llama, name: str, budget: int) -> None:
    with ours.init_empty_weights():
        model = transformers.LlamaForCausalLM(tiny_llama)  # 4 layers of 74 KB in float32
    max_memory = BUDGETS[budget]
    expected = accelerate.infer_auto_device_map(
        model, dict(max_memory), ["LlamaDecoderLayer"], dtype=getattr(TheirCustomDtype, name)
    )
    got = ours.infer_auto_device_map(
        model, dict(max_memory), ["LlamaDecoderLayer"], dtype=getattr(ours.CustomDtype, name)
    )
    assert got == dict(expected)
    # Accelerate's own enum (what callers of accelerate.utils pass) is taken as well
    assert (
        ours.infer_auto_device_map(
            model, dict(max_memory), ["LlamaDecoderLayer"], dtype=getattr(TheirCustomDtype, name)
        )
        == got
    )


def test_custom_dtype_plans_by_the_width_it_names(tiny_llama) -> None:
    with ours.init_empty_weights():
        model = transformers.LlamaForCausalLM(tiny_llama)  # 330 KB in float32: 82 KB in int4, 41 KB in int2
    budget = {"cpu": 60_000, "disk": 10**9}

    def plan(dtype) -> dict:
        return ours.infer_auto_device_map(model, dict(budget), ["LlamaDecoderLayer"], dtype=dtype)

    assert plan(ours.CustomDtype.INT2) == {"": "cpu"}
    int4 = plan(ours.CustomDtype.INT4)
    assert [n for n, d in int4.items() if d == "cpu"] == ["model.embed_tokens", "model.layers.0", "model.layers.1"]
    fp8 = plan(ours.CustomDtype.FP8)
    assert [n for n, d in fp8.items() if d == "cpu"] == ["model.embed_tokens"]
    assert plan("float8_e4m3fn") == fp8  # FP8 counts as any 1-byte dtype


# ---------------------------------------------------------------------------------------------
# save_offload_index and load_offloaded_weights


def _sample() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        "0.weight": torch.randn(4, 3),
        "0.bias": torch.randn(4).half(),
        "1.weight": torch.randn(4).to(torch.bfloat16),
        "1.bias": torch.randn(4).to(torch.float8_e4m3fn),
        "1.running_mean": torch.randn(4),
        "1.num_batches_tracked": torch.tensor(7),
    }


class _Target(nn.Module):
    """Names as ``_sample`` has them, tensors of those dtypes and shapes on the meta device."""

    def __init__(self) -> None:
        super().__init__()
        first, second = nn.Module(), nn.Module()
        first.weight = nn.Parameter(torch.empty(4, 3, device="meta"))
        first.bias = nn.Parameter(torch.empty(4, device="meta", dtype=torch.float16))
        second.weight = nn.Parameter(torch.empty(4, device="meta", dtype=torch.bfloat16))
        second.bias = nn.Parameter(torch.empty(4, device="meta", dtype=torch.float8_e4m3fn), requires_grad=False)
        second.register_buffer("running_mean", torch.empty(4, device="meta"))
        second.register_buffer("num_batches_tracked", torch.empty((), device="meta", dtype=torch.int64))
        self.add_module("0", first)
        self.add_module("1", second)


def _assert_loaded(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    state = model.state_dict()
    assert set(state) == set(tensors)
    for name, tensor in tensors.items():
        got = state[name]
        assert got.device.type == "cpu" and got.dtype == tensor.dtype and got.shape == tensor.shape, name
        assert torch.equal(got.reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8)), name
    assert isinstance(model.get_submodule("0").weight, nn.Parameter)


def test_offload_round_trip_through_the_saved_index(tmp_path: Path) -> None:
    tensors = _sample()
    first = {n: t for n, t in tensors.items() if n.startswith("0.")}
    second = {n: t for n, t in tensors.items() if n.startswith("1.")}
    index: dict = {}
    for name, tensor in first.items():
        ours.offload_weight(tensor, name, tmp_path, index)
    ours.save_offload_index(index, tmp_path)
    index = {}
    for name, tensor in second.items():
        ours.offload_weight(tensor, name, tmp_path, index)
    ours.save_offload_index(index, tmp_path)  # merged into the index already there
    ours.save_offload_index({}, tmp_path)
    ours.save_offload_index(None, tmp_path)
    on_disk = json.loads((tmp_path / "index.json").read_text())
    assert set(on_disk) == set(tensors)
    assert on_disk["1.weight"] == {"dtype": "bfloat16", "shape": [4]}
    assert on_disk["1.num_batches_tracked"] == {"dtype": "int64", "shape": []}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["index.json", *(f"{n}.dat" for n in tensors)])
    model = _Target()
    ours.load_offloaded_weights(model, on_disk, tmp_path)
    _assert_loaded(model, tensors)
    ours.load_offloaded_weights(model, None, tmp_path)  # nothing to load
    ours.load_offloaded_weights(model, {}, tmp_path)
    _assert_loaded(model, tensors)


def test_save_offload_index_writes_nothing_for_an_empty_index(tmp_path: Path) -> None:
    ours.save_offload_index({}, tmp_path)
    ours.save_offload_index(None, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_an_index_that_cannot_be_written_leaves_the_old_one_whole(tmp_path: Path) -> None:
    ours.save_offload_index({"a": {"dtype": "float32", "shape": [2]}}, tmp_path)
    before = (tmp_path / "index.json").read_bytes()
    with pytest.raises(TypeError):
        ours.save_offload_index({"b": {"dtype": object(), "shape": [2]}}, tmp_path)
    assert (tmp_path / "index.json").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["index.json"]  # no temporary file left behind


def test_files_accelerate_writes_are_loaded_by_x(tmp_path: Path) -> None:
    tensors = _sample()
    index: dict = {}
    for name, tensor in tensors.items():
        their_offload.offload_weight(tensor, name, tmp_path, index)
        if name == "0.bias":  # two saves: the second merges into the first's file
            their_offload.save_offload_index(index, tmp_path)
            index = {}
    their_offload.save_offload_index(index, tmp_path)
    on_disk = json.loads((tmp_path / "index.json").read_text())
    assert set(on_disk) == set(tensors)
    for name, tensor in tensors.items():
        assert torch.equal(
            ours.load_offloaded_weight(tmp_path / f"{name}.dat", on_disk[name]).reshape(-1).view(torch.uint8),
            tensor.reshape(-1).view(torch.uint8),
        ), name
    model = _Target()
    ours.load_offloaded_weights(model, on_disk, tmp_path)
    _assert_loaded(model, tensors)
    # x merges into Accelerate's index, and Accelerate reads the merged one
    extra = ours.offload_weight(torch.arange(5.0), "extra", tmp_path)
    ours.save_offload_index(extra, tmp_path)
    merged = json.loads((tmp_path / "index.json").read_text())
    assert merged == {**on_disk, "extra": {"dtype": "float32", "shape": [5]}}
    assert torch.equal(
        their_offload.load_offloaded_weight(str(tmp_path / "extra.dat"), merged["extra"]), torch.arange(5.0)
    )


def test_files_x_writes_are_loaded_by_accelerate(tmp_path: Path) -> None:
    tensors = _sample()
    index: dict = {}
    for name, tensor in tensors.items():
        ours.offload_weight(tensor, name, tmp_path, index)
    ours.save_offload_index({n: index[n] for n in list(index)[:3]}, tmp_path)
    their_offload.save_offload_index({n: index[n] for n in list(index)[3:]}, tmp_path)  # Accelerate merges into x's
    ours.save_offload_index({n: index[n] for n in list(index)[3:]}, tmp_path)  # and x into Accelerate's
    on_disk = json.loads((tmp_path / "index.json").read_text())
    assert on_disk == index
    theirs_model, ours_model = _Target(), _Target()
    theirs.load_offloaded_weights(theirs_model, on_disk, str(tmp_path))
    _assert_loaded(theirs_model, tensors)
    ours.load_offloaded_weights(ours_model, on_disk, tmp_path)
    for name, tensor in ours_model.state_dict().items():
        assert torch.equal(
            tensor.reshape(-1).view(torch.uint8), theirs_model.state_dict()[name].reshape(-1).view(torch.uint8)
        ), name


def test_an_index_with_bitsandbytes_statistics_is_refused_before_loading(tmp_path: Path) -> None:
    torch.manual_seed(0)
    index: dict = {}
    ours.offload_weight(torch.randn(4, 3), "0.weight", tmp_path, index)
    ours.offload_weight(torch.randn(4), "0.SCB", tmp_path, index)
    ours.save_offload_index(index, tmp_path)
    model = _Target()
    with pytest.raises(ValueError, match="SCB"):
        ours.load_offloaded_weights(model, index, tmp_path)
    assert model.get_submodule("0").weight.device.type == "meta"  # nothing was loaded


# ---------------------------------------------------------------------------------------------
# check_device_map replaced, as transformers replaces it


def _two_linears() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))


@pytest.mark.parametrize("device_map", [{"0": "cpu"}, {"0": "cpu", "1.weight": "cpu"}], ids=["module", "tensor"])
def test_a_map_leaving_tensors_unplaced_is_refused_as_accelerate_refuses_it(device_map) -> None:
    with pytest.raises(ValueError, match=r"does not place (1\.weight, )?1\.bias;"):
        planning.plan_device_map(_two_linears(), dict(device_map))
    with pytest.raises(ValueError, match=r"does not place (1\.weight, )?1\.bias;"):
        ours.dispatch_model(_two_linears(), dict(device_map))
    with pytest.raises(ValueError, match=r"does not give any device for the following parameters: .*1\.bias"):
        accelerate.dispatch_model(_two_linears(), dict(device_map))


@pytest.mark.parametrize("device_map", [{"0": "cpu"}, {"0": "cpu", "1.weight": "cpu"}], ids=["module", "tensor"])
def test_a_replaced_check_takes_the_map_as_given(monkeypatch, device_map) -> None:
    monkeypatch.setattr(planning, "check_device_map", lambda *args, **kwargs: None)
    monkeypatch.setattr(accelerate.big_modeling, "check_device_map", lambda *args, **kwargs: None)
    plan = planning.plan_device_map(_two_linears(), dict(device_map))
    assert dict(plan.entries) == device_map and plan.offload_folder is None
    x = torch.ones(2, 3)
    expected = _two_linears()(x)
    got = ours.dispatch_model(_two_linears(), dict(device_map))
    theirs_model = accelerate.dispatch_model(_two_linears(), dict(device_map))
    assert got.hf_device_map == theirs_model.hf_device_map == device_map
    assert torch.equal(got(x), expected) and torch.equal(theirs_model(x), expected)


def test_a_replaced_check_still_normalises_devices_and_keeps_the_offload_folder(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(planning, "check_device_map", lambda *args, **kwargs: None)
    plan = planning.plan_device_map(
        _two_linears(), {"0": torch.device("cpu"), "1.weight": "disk"}, offload_folder=tmp_path
    )
    assert dict(plan.entries) == {"0": "cpu", "1.weight": "disk"}
    assert Path(plan.offload_folder) == tmp_path
    with pytest.raises(ValueError):
        planning.plan_device_map(_two_linears(), {"0": "no-such-device"})


def test_the_original_check_is_back_after_the_replacement(monkeypatch) -> None:
    original = planning.check_device_map
    with monkeypatch.context() as patch:
        patch.setattr(planning, "check_device_map", lambda *args, **kwargs: None)
        planning.plan_device_map(_two_linears(), {"0": "cpu"})
    assert planning.check_device_map is original
    with pytest.raises(ValueError, match="does not place"):
        planning.plan_device_map(_two_linears(), {"0": "cpu"})
