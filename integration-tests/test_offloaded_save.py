"""``Accelerator.save_model`` / ``get_state_dict`` of a model dispatched with a disk block write the real
weights, whichever library dispatched it (x-bigmodel's or Accelerate's ``dispatch_model``)."""

from __future__ import annotations

from pathlib import Path

import accelerate
import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import x_bigmodel
from x_runtime import Accelerator


@pytest.mark.parametrize("dispatch", [x_bigmodel.dispatch_model, accelerate.dispatch_model], ids=["x", "accelerate"])
def test_a_model_with_a_disk_block_saves_its_real_weights(dispatch, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))
    original = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    expected = model(torch.ones(2, 4))
    dispatch(model, device_map={"0": "cpu", "1": "disk", "2": "cpu"}, offload_dir=str(tmp_path / "offload"))
    assert model[1].weight.is_meta  # really offloaded: the value lives behind the hook
    accelerator = Accelerator(cpu=True)
    weights = accelerator.get_state_dict(model)
    assert sorted(weights) == sorted(original)
    assert all(torch.equal(weights[name], original[name]) for name in original)
    accelerator.save_model(model, tmp_path / "saved")
    saved = load_file(tmp_path / "saved" / "model.safetensors")
    assert all(torch.equal(saved[name], original[name]) for name in original)
    torch.testing.assert_close(model(torch.ones(2, 4)), expected)  # the dispatched model still runs
