"""``core.offloaded``: a model whose offloaded parameters are meta tensors saves the weights its hooks hold."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from x_runtime import Accelerator
from x_runtime.core.offloaded import state_dict_of


class HoldsWeights:
    """A hook as dispatchers leave it on an offloaded module: the values in ``weights_map``."""

    def __init__(self, weights: dict[str, torch.Tensor]) -> None:
        self.weights_map = weights


def _offloaded() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))
    original = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    held = {name: tensor.clone() for name, tensor in model[1].state_dict().items()}
    model[1].to("meta")
    model[1]._hf_hook = HoldsWeights(held)
    return model, original


def test_save_model_and_get_state_dict_read_offloaded_weights_from_the_hook(tmp_path: Path) -> None:
    model, original = _offloaded()
    accelerator = Accelerator(cpu=True)
    weights = accelerator.get_state_dict(model)
    assert sorted(weights) == sorted(original)
    assert all(torch.equal(weights[name], original[name]) for name in original)
    accelerator.save_model(model, tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert all(torch.equal(saved[name], original[name]) for name in original)


def test_a_meta_weight_no_hook_holds_is_named() -> None:
    model, _ = _offloaded()
    del model[1]._hf_hook
    with pytest.raises(ValueError, match=r"^1\.bias \(and 1 more\) is on the meta device and no hook"):
        state_dict_of(model)
