"""Accelerate's offload-folder functions: raw ``.dat`` files and ``index.json`` on disk, read back
by ``OffloadedWeightsLoader`` (also from x's own safetensors offload index)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from x_bigmodel import (
    OffloadedWeightsLoader,
    PrefixedDataset,
    disk_offload,
    extract_submodules_state_dict,
    load_offloaded_weight,
    offload_state_dict,
    offload_weight,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.int64])
def test_offload_weight_writes_raw_bytes_and_reads_them_back(tmp_path: Path, dtype: torch.dtype) -> None:
    weight = (torch.randn(3, 5) * 4).to(dtype)
    index = offload_weight(weight, "layer.weight", tmp_path)
    path = tmp_path / "layer.weight.dat"
    assert path.read_bytes() == weight.contiguous().view(torch.uint8).numpy().tobytes()
    assert index == {"layer.weight": {"dtype": str(dtype).removeprefix("torch."), "shape": [3, 5]}}
    back = load_offloaded_weight(path, index["layer.weight"])
    assert back.dtype == dtype and back.shape == (3, 5)
    assert torch.equal(back.view(torch.uint8), weight.view(torch.uint8))


def test_offload_weight_scalar_and_noncontiguous(tmp_path: Path) -> None:
    index = offload_weight(torch.tensor(7, dtype=torch.int64), "steps", tmp_path, {"kept": {}})
    assert index["steps"] == {"dtype": "int64", "shape": []} and "kept" in index
    assert load_offloaded_weight(tmp_path / "steps.dat", index["steps"]).item() == 7
    transposed = torch.arange(6.0).reshape(2, 3).t()
    info = offload_weight(transposed, "t", tmp_path)["t"]
    assert torch.equal(load_offloaded_weight(tmp_path / "t.dat", info), transposed)


def test_load_offloaded_weight_rejects_a_short_file(tmp_path: Path) -> None:
    (tmp_path / "w.dat").write_bytes(b"\0" * 8)
    with pytest.raises(ValueError, match="holds 8 bytes"):
        load_offloaded_weight(tmp_path / "w.dat", {"dtype": "float32", "shape": [4]})


def test_offload_state_dict_merges_the_index(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    state = model.state_dict()
    offload_state_dict(tmp_path, {k: v for k, v in state.items() if k.startswith("0.")})
    offload_state_dict(tmp_path, {k: v for k, v in state.items() if k.startswith("1.")})
    index = json.loads((tmp_path / "index.json").read_text())
    assert set(index) == set(state)
    assert index["1.num_batches_tracked"] == {"dtype": "int64", "shape": []}
    for name in state:
        assert (tmp_path / f"{name}.dat").is_file()
    assert not list(tmp_path.glob(".*.tmp"))


def test_offloaded_weights_loader_reads_memory_then_disk(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    state = model.state_dict()
    offload_state_dict(tmp_path, state)
    in_memory = {"0.weight": torch.zeros(4, 3)}
    loader = OffloadedWeightsLoader(state_dict=in_memory, save_folder=tmp_path)
    assert sorted(loader) == sorted(state) and len(loader) == len(state)
    assert torch.equal(loader["0.weight"], torch.zeros(4, 3))  # memory wins over the folder
    for name in ("0.bias", "1.weight", "1.bias"):
        assert torch.equal(loader[name], state[name])
    with pytest.raises(ValueError, match="needs a state_dict"):
        OffloadedWeightsLoader()


def test_offloaded_weights_loader_reads_xs_safetensors_offload(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    disk_offload(model, tmp_path, execution_device="cpu")
    assert list(tmp_path.glob("*.safetensors"))
    loader = OffloadedWeightsLoader(save_folder=tmp_path)
    assert sorted(loader) == sorted(state)
    for name, value in state.items():
        assert torch.equal(loader[name], value)
    prefixed = PrefixedDataset(loader, "1.")
    assert sorted(prefixed) == ["bias", "weight"]
    assert torch.equal(prefixed["weight"], state["1.weight"])


def test_extract_submodules_state_dict_matches_whole_names() -> None:
    state = {"a.1.w": 0, "a.10.w": 1, "a.2": 2, "b": 3}
    assert extract_submodules_state_dict(state, ["a.1", "a.2"]) == {"a.1.w": 0, "a.2": 2}
    assert extract_submodules_state_dict(state, []) == {}


def test_a_folder_that_is_checkpoint_and_offload_folder_loads_the_checkpoint(tmp_path: Path) -> None:
    """A torch .bin checkpoint offloaded into its own folder: the offload writes its weights as
    ``pytorch_model.safetensors`` beside ``pytorch_model.bin``; loading the folder again must read
    the checkpoint, not the offload's few weights (it failed "7 tensors that the checkpoint lacks")."""
    from x_bigmodel import load_checkpoint_and_dispatch

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 5)).eval()
    inputs = torch.randn(3, 3)
    expected = model(inputs)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    load_checkpoint_and_dispatch(
        model, tmp_path, device_map={"0": "cpu", "1": "disk", "2": "cpu"}, offload_folder=tmp_path
    )
    assert (tmp_path / "pytorch_model.safetensors").is_file()  # the offload's storage, listed in index.json
    assert torch.allclose(model(inputs), expected)
    fresh = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 5)).eval()
    load_checkpoint_and_dispatch(fresh, tmp_path)
    assert torch.equal(fresh(inputs), expected)


def test_a_safetensors_checkpoint_offloaded_in_place_still_loads_from_its_folder(tmp_path: Path) -> None:
    """The offload of a safetensors checkpoint reads it in place: index.json names the checkpoint."""
    from safetensors.torch import save_file

    from x_bigmodel import load_checkpoint_and_dispatch

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 5)).eval()
    inputs = torch.randn(3, 3)
    expected = model(inputs)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    load_checkpoint_and_dispatch(
        model, tmp_path, device_map={"0": "cpu", "1": "disk", "2": "cpu"}, offload_folder=tmp_path
    )
    fresh = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 5)).eval()
    load_checkpoint_and_dispatch(fresh, tmp_path)
    assert torch.equal(fresh(inputs), expected)
