"""load_checkpoint_in_model streams real safetensors/torch files into meta-built models."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from x_bigmodel.loading.checkpoint import (
    load_checkpoint_in_model,
    resolve_checkpoint_files,
    set_module_tensor_to_device,
)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 4)
        self.block = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
        self.head = nn.Linear(4, 5, bias=False)
        self.register_buffer("positions", torch.arange(4))
        self.register_buffer("scratch", torch.zeros(2), persistent=False)


def meta_net(tied: bool = False) -> Net:
    with torch.device("meta"):
        net = Net()
    if tied:
        net.head.weight = net.embed.weight
    return net


def reference_state(tied: bool = False) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    net = Net()
    state = {k: v.clone() for k, v in net.state_dict().items()}
    if tied:
        del state["head.weight"]
    return state


def assert_loaded(net: nn.Module, state: dict[str, torch.Tensor]) -> None:
    for name, value in state.items():
        got = net.state_dict()[name]
        assert got.device.type == "cpu", name
        assert torch.equal(got, value), name


def write_sharded(folder, state, shards=3) -> None:
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        part = names[i::shards]
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: state[k] for k in part}, str(folder / fname))
        weight_map.update(dict.fromkeys(part, fname))
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


# --- formats ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mmap", [True, False], ids=["mapped", "copied"])
def test_single_safetensors_file(tmp_path, mmap) -> None:
    state = reference_state()
    path = tmp_path / "model.safetensors"
    save_file(state, str(path))
    net = meta_net()
    assert load_checkpoint_in_model(net, path, show_progress=False, mmap=mmap) == {}
    assert_loaded(net, state)
    assert isinstance(net.block[0].weight, nn.Parameter) and net.block[0].weight.requires_grad
    assert net.positions.dtype == torch.int64
    if sys.platform.startswith("linux"):
        # Mapped: the weights are the file's pages; copied: the file is not kept open at all.
        assert (str(path) in Path("/proc/self/maps").read_text()) == mmap
    # Writes to the weights stay in this process (a private mapping), never reach the file.
    net.block[0].weight.data.zero_()
    assert not torch.equal(net.block[0].weight, state["block.0.weight"])
    assert torch.equal(load_file(str(path))["block.0.weight"], state["block.0.weight"])


def test_sharded_index_and_folder_prefer_index(tmp_path) -> None:
    state = reference_state()
    write_sharded(tmp_path, state)
    # A stray single file beside the index is ignored: the index wins.
    save_file({"junk": torch.zeros(1)}, str(tmp_path / "zzz.safetensors"))
    for checkpoint in (tmp_path / "model.safetensors.index.json", tmp_path):
        net = meta_net()
        load_checkpoint_in_model(net, checkpoint, show_progress=False)
        assert_loaded(net, state)
    assert len(resolve_checkpoint_files(tmp_path)) == 3


def test_folder_with_single_file(tmp_path) -> None:
    state = reference_state()
    save_file(state, str(tmp_path / "model.safetensors"))
    net = meta_net()
    load_checkpoint_in_model(net, tmp_path, show_progress=False)
    assert_loaded(net, state)


def test_torch_bin_with_weights_only(tmp_path) -> None:
    state = reference_state()
    torch.save(state, tmp_path / "pytorch_model.bin")
    net = meta_net()
    load_checkpoint_in_model(net, tmp_path, show_progress=False)
    assert_loaded(net, state)


def test_torch_file_with_pickled_objects_is_refused(tmp_path) -> None:
    torch.save({"weight": torch.zeros(1), "obj": Net}, tmp_path / "model.pt")
    with pytest.raises(ValueError, match=r"(?s)cannot read checkpoint file .*model\.pt.*weights_only=True"):
        load_checkpoint_in_model(meta_net(), tmp_path / "model.pt", show_progress=False)


# --- dtypes, devices, ties --------------------------------------------------------------------


def test_dtype_conversion_keeps_integer_buffers(tmp_path) -> None:
    state = reference_state()
    save_file(state, str(tmp_path / "model.safetensors"))
    net = meta_net()
    load_checkpoint_in_model(net, tmp_path, dtype="float16", keep_in_fp32_modules=["block.1"], show_progress=False)
    assert net.block[0].weight.dtype == torch.float16
    assert torch.equal(net.block[0].weight, state["block.0.weight"].half())
    assert net.block[1].weight.dtype == torch.float32  # kept in fp32
    assert net.positions.dtype == torch.int64 and torch.equal(net.positions, torch.arange(4))


def test_default_dtype_follows_the_model(tmp_path) -> None:
    state = {k: (v.half() if v.is_floating_point() else v) for k, v in reference_state().items()}
    save_file(state, str(tmp_path / "model.safetensors"))
    net = meta_net()
    load_checkpoint_in_model(net, tmp_path, show_progress=False)
    assert net.head.weight.dtype == torch.float32


def test_device_map_cpu_and_disk(tmp_path) -> None:
    state = reference_state()
    (tmp_path / "ckpt").mkdir()
    write_sharded(tmp_path / "ckpt", state)
    offload = tmp_path / "offload"
    net = meta_net()
    device_map = {"": "cpu", "block": "disk", "block.1.bias": "cpu"}
    index = load_checkpoint_in_model(
        net, tmp_path / "ckpt", device_map=device_map, offload_folder=offload, dtype=torch.float16, show_progress=False
    )
    assert sorted(index) == ["block.0.bias", "block.0.weight", "block.1.weight"]
    entry = index["block.0.weight"]
    assert entry["key"] == "block.0.weight" and entry["dtype"] == "float16" and entry["shape"] == [4, 4]
    # The weight is read in place from the checkpoint, not copied.
    assert entry["safetensors_file"].startswith(str((tmp_path / "ckpt").resolve()))
    assert json.loads((offload / "index.json").read_text()) == index
    assert list(offload.iterdir()) == [offload / "index.json"]
    assert net.block[0].weight.device.type == "meta"
    assert net.block[1].bias.device.type == "cpu"  # the longest prefix wins
    assert net.head.weight.device.type == "cpu"


@pytest.mark.parametrize("offload_buffers", [False, True])
def test_buffers_of_disk_modules(tmp_path, offload_buffers) -> None:
    save_file(reference_state(), str(tmp_path / "model.safetensors"))
    net = meta_net()
    index = load_checkpoint_in_model(
        net, tmp_path, device_map={"": "disk"}, offload_buffers=offload_buffers, show_progress=False
    )
    assert ("positions" in index) is offload_buffers
    assert net.positions.device.type == ("meta" if offload_buffers else "cpu")
    assert "embed.weight" in index


def test_disk_entries_from_torch_file_are_saved_as_safetensors(tmp_path) -> None:
    state = reference_state()
    torch.save(state, tmp_path / "model.bin")
    with pytest.raises(ValueError, match=r"block\.0\.weight is mapped to 'disk' but comes from a torch file"):
        load_checkpoint_in_model(meta_net(), tmp_path / "model.bin", device_map={"": "cpu", "block": "disk"})
    net = meta_net()
    index = load_checkpoint_in_model(
        net, tmp_path / "model.bin", device_map={"": "cpu", "block": "disk"}, offload_folder=tmp_path / "off"
    )
    from safetensors import safe_open

    with safe_open(index["block.0.weight"]["safetensors_file"], framework="pt") as f:
        assert torch.equal(f.get_tensor(index["block.0.weight"]["key"]), state["block.0.weight"])


def test_unplaced_tensor_is_an_error(tmp_path) -> None:
    save_file(reference_state(), str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"^embed.weight has no device in device_map"):
        load_checkpoint_in_model(meta_net(), tmp_path, device_map={"block": "cpu"}, show_progress=False)


def test_tied_weights_stay_tied(tmp_path) -> None:
    state = reference_state(tied=True)
    save_file(state, str(tmp_path / "model.safetensors"))
    net = meta_net(tied=True)
    load_checkpoint_in_model(net, tmp_path, show_progress=False)
    assert net.head.weight is net.embed.weight
    assert net.head.weight.device.type == "cpu"
    assert torch.equal(net.head.weight, state["embed.weight"])


def test_set_module_tensor_to_device() -> None:
    net = meta_net()
    set_module_tensor_to_device(net, "block.0.weight", "cpu", value=torch.ones(4, 4), dtype="bf16")
    assert net.block[0].weight.dtype == torch.bfloat16 and isinstance(net.block[0].weight, nn.Parameter)
    set_module_tensor_to_device(net, "positions", "cpu", value=torch.arange(4, dtype=torch.int32))
    assert net.positions.dtype == torch.int32
    with pytest.raises(
        ValueError, match=r'shape torch.Size\(\[3\]\) in "bias" \(which has shape torch.Size\(\[4\]\)\)'
    ):
        set_module_tensor_to_device(net, "block.0.bias", "cpu", value=torch.ones(3))
    with pytest.raises(ValueError, match=r"head\.weight is on the meta device and has no data"):
        set_module_tensor_to_device(net, "head.weight", "cpu")
    with pytest.raises(AttributeError, match="no parameter or buffer 'nope'"):
        set_module_tensor_to_device(net, "block.0.nope", "cpu")


# --- errors -----------------------------------------------------------------------------------


def test_missing_keys_error_or_allowed(tmp_path) -> None:
    state = reference_state()
    del state["head.weight"], state["block.0.bias"]
    save_file(state, str(tmp_path / "model.safetensors"))
    net = meta_net()
    with pytest.raises(ValueError) as info:
        load_checkpoint_in_model(net, tmp_path, show_progress=False)
    assert str(info.value) == (
        "Net has 2 tensors (block.0.bias, head.weight) that the checkpoint lacks; "
        "pass allow_missing_keys=True to load the rest"
    )
    assert net.embed.weight.device.type == "meta"  # checks happen before any load
    with pytest.warns(UserWarning, match="Net has 2 tensors"):
        load_checkpoint_in_model(net, tmp_path, allow_missing_keys=True, show_progress=False)
    assert net.head.weight.device.type == "meta" and net.embed.weight.device.type == "cpu"


@pytest.mark.filterwarnings("ignore:the checkpoint has 1 tensor")
def test_many_missing_keys_are_capped(tmp_path) -> None:
    save_file({"x": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    with torch.device("meta"):
        net = nn.Sequential(*(nn.Linear(1, 1) for _ in range(8)))
    with pytest.raises(ValueError, match=r"has 16 tensors \(0.weight, .*, 4.bias, \.\.\. \(6 more\)\)"):
        load_checkpoint_in_model(net, tmp_path, show_progress=False)


def test_unexpected_keys_warn_or_raise_when_strict(tmp_path) -> None:
    state = reference_state()
    state["extra.weight"] = torch.zeros(2)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.warns(UserWarning, match=r"the checkpoint has 1 tensor \(extra.weight\) that Net does not have"):
        load_checkpoint_in_model(meta_net(), tmp_path, show_progress=False)
    with pytest.raises(ValueError, match=r"1 tensor \(extra.weight\) that Net does not have \(strict=True\)"):
        load_checkpoint_in_model(meta_net(), tmp_path, strict=True, show_progress=False)


def test_shape_mismatch_names_tensor_and_shapes(tmp_path) -> None:
    state = reference_state()
    state["block.0.weight"] = torch.zeros(4, 3)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError) as info:
        load_checkpoint_in_model(meta_net(), tmp_path, show_progress=False)
    assert str(info.value) == (
        "shape mismatch for block.0.weight: the checkpoint (model.safetensors) has (4, 3), the model expects (4, 4)"
    )


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_or_truncated_file_names_it(tmp_path, damage) -> None:
    path = tmp_path / "model.safetensors"
    save_file(reference_state(), str(path))
    data = path.read_bytes()
    path.write_bytes(b"\xff" * 64 if damage == "garbage" else data[: len(data) - 16])
    with pytest.raises(ValueError, match=rf"^cannot read checkpoint file '{path}': .*corrupt or truncated"):
        load_checkpoint_in_model(meta_net(), path, show_progress=False)


def test_index_naming_a_missing_shard(tmp_path) -> None:
    write_sharded(tmp_path, reference_state())
    (tmp_path / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(ValueError) as info:
        load_checkpoint_in_model(meta_net(), tmp_path, show_progress=False)
    assert str(info.value).startswith(
        f"sharded checkpoint index '{tmp_path / 'model.safetensors.index.json'}' names shard "
        f"'model-00002-of-00003.safetensors', which does not exist at "
    )


def test_missing_checkpoint_and_empty_folder(tmp_path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_checkpoint_in_model(meta_net(), tmp_path / "nope.safetensors")
    with pytest.raises(ValueError, match=r"holds no \*.index.json, \*.safetensors"):
        load_checkpoint_in_model(meta_net(), tmp_path)


# --- progress: see test_load_progress.py ---------------------------------------------------


# --- memory -----------------------------------------------------------------------------------

_PEAK_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from torch import nn
    from x_bigmodel.loading.checkpoint import load_checkpoint_in_model

    def hwm_kb():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])

    with torch.device("meta"):
        model = nn.Sequential(*(nn.Linear(1024, 1024, bias=False) for _ in range(50)))
    before = hwm_kb()
    load_checkpoint_in_model(model, sys.argv[1], show_progress=False)
    after = hwm_kb()
    assert float(model[49].weight.detach()[0, 0]) == 49.0
    print(after - before)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_peak_memory_is_model_plus_one_tensor_not_two_models(tmp_path) -> None:
    # 50 x 4 MiB float32 = 200 MiB in ONE file: a shard held mapped beside the model would show 2x.
    path = tmp_path / "model.safetensors"
    save_file({f"{i}.weight": torch.full((1024, 1024), float(i)) for i in range(50)}, str(path))
    model_kb = 50 * 4 * 1024
    out = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, str(path)], capture_output=True, text=True, check=True)
    growth_kb = int(out.stdout.strip())
    assert growth_kb < 1.5 * model_kb, f"peak RSS grew {growth_kb} kB for a {model_kb} kB model"
