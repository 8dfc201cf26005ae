"""Accelerate's ``load_state_dict``: a safetensors or torch file read into a state dict, placed by
``device_map``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from x_bigmodel import load_state_dict


def _state() -> dict[str, torch.Tensor]:
    return {"a.weight": torch.randn(4, 5), "a.bias": torch.randn(4), "b": torch.arange(3, dtype=torch.int32)}


def test_load_state_dict_reads_safetensors_into_memory_of_its_own(tmp_path: Path) -> None:
    state = _state()
    path = tmp_path / "model.safetensors"
    save_file(state, str(path))
    loaded = load_state_dict(path, device_map={"a": "cpu", "b": "disk"})
    assert list(loaded) == sorted(state)
    for name, value in state.items():
        assert torch.equal(loaded[name], value) and loaded[name].dtype == value.dtype
        assert loaded[name].device.type == "cpu"
    path.unlink()  # the tensors do not depend on the file
    assert torch.equal(loaded["a.weight"], state["a.weight"])


def test_load_state_dict_reads_torch_files(tmp_path: Path) -> None:
    state = _state()
    path = tmp_path / "model.bin"
    torch.save(state, path)
    loaded = load_state_dict(path)
    assert set(loaded) == set(state)
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


def test_load_state_dict_needs_an_entry_for_every_tensor(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file(_state(), str(path))
    with pytest.raises(ValueError, match="b has no device in device_map"):
        load_state_dict(path, device_map={"a": "cpu"})
