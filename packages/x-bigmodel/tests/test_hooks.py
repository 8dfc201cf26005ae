"""Accelerate's hook API (``ModelHook``, ``add_hook_to_module``), side by side with Accelerate's own."""

from __future__ import annotations

import pytest
import torch
from accelerate.hooks import ModelHook as AccelerateHook
from accelerate.hooks import add_hook_to_module as accelerate_add
from torch import nn

from x_bigmodel import ModelHook, add_hook_to_module


def _no_grad(base: type) -> object:
    hook = base()
    hook.no_grad = True
    return hook


@pytest.mark.parametrize("add, base", [(add_hook_to_module, ModelHook), (accelerate_add, AccelerateHook)])
def test_a_no_grad_hook_runs_the_forward_without_gradients(add, base) -> None:
    torch.manual_seed(0)
    layer = add(nn.Linear(2, 2), _no_grad(base))
    out = layer(torch.randn(1, 2))
    assert out.requires_grad is False
    # Only the forward: the grad mode around the call is the caller's again.
    assert torch.is_grad_enabled()
    plain = add(nn.Linear(2, 2), base())
    assert plain(torch.randn(1, 2)).requires_grad is True


def test_the_grad_mode_comes_back_when_the_forward_raises() -> None:
    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("boom")

    layer = add_hook_to_module(Boom(), _no_grad(ModelHook))
    with pytest.raises(RuntimeError, match="boom"):
        layer(torch.ones(1))
    assert torch.is_grad_enabled()
    with torch.no_grad():  # and a caller's own no_grad stays as it was
        add_hook_to_module(nn.Linear(2, 2), _no_grad(ModelHook))(torch.ones(1, 2))
        assert not torch.is_grad_enabled()


def test_remove_hook_from_submodules_removes_every_hook_below() -> None:
    from x_bigmodel import remove_hook_from_submodules

    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2)))
    for module in (model, model[0], model[1][0]):
        add_hook_to_module(module, _no_grad(ModelHook))
    remove_hook_from_submodules(model)
    assert not any(hasattr(module, "_hf_hook") for module in model.modules())
    assert model(torch.ones(1, 2)).requires_grad  # the forwards are plain again
