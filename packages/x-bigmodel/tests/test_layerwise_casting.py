"""Layerwise casting: castable layers stored small, computed large, the rest untouched."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from x_bigmodel import (
    SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING,
    LayerwiseCastingHook,
    ModelHook,
    SequentialHook,
    add_hook_to_module,
    attach_layerwise_casting_hooks,
    remove_hook_from_submodules,
)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.conv = nn.Conv1d(4, 4, 1)
        self.norm = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(self.proj(x).unsqueeze(-1)).squeeze(-1)
        return self.norm(x)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def dtypes(model: nn.Module) -> dict[str, torch.dtype]:
    return {name: p.dtype for name, p in model.named_parameters()}


@pytest.mark.parametrize("storage", [torch.float16, torch.bfloat16, torch.float8_e4m3fn])
def test_castable_layers_are_stored_small_and_computed_in_the_compute_dtype(storage: torch.dtype) -> None:
    torch.manual_seed(0)
    model = Model()
    reference = Model()
    reference.load_state_dict(model.state_dict())
    attach_layerwise_casting_hooks(model, storage_dtype=storage, compute_dtype=torch.float32)
    stored = dtypes(model)
    assert {name for name, dtype in stored.items() if dtype == storage} == {
        f"blocks.{i}.{layer}.{p}" for i in (0, 1) for layer in ("proj", "conv") for p in ("weight", "bias")
    } | {"head.weight", "head.bias"}
    assert stored["embed.weight"] == stored["blocks.0.norm.weight"] == torch.float32
    ids = torch.tensor([1, 2, 3])
    with torch.no_grad():
        out = model(ids)
        # The reference computes with the weights rounded the same way, in float32.
        for name, param in reference.named_parameters():
            param.copy_(param.to(stored[name]).float())
        expected = reference(ids)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected)
    assert dtypes(model) == stored  # back in storage after the forward


def test_skip_patterns_and_classes_keep_whole_subtrees() -> None:
    model = Model()
    attach_layerwise_casting_hooks(
        model, torch.float16, torch.float32, skip_modules_pattern=r"blocks\.1", skip_modules_classes=(nn.Conv1d,)
    )
    stored = dtypes(model)
    assert stored["blocks.0.proj.weight"] == stored["head.weight"] == torch.float16
    assert stored["blocks.0.conv.weight"] == stored["blocks.1.proj.weight"] == torch.float32
    assert not hasattr(model.blocks[1].proj, "_hf_hook")


def test_appends_to_an_existing_hook_and_comes_off() -> None:
    calls: list[torch.dtype] = []

    class Record(ModelHook):
        def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            calls.append(module.weight.dtype)
            return args, kwargs

    layer = nn.Linear(2, 2)
    add_hook_to_module(layer, Record())
    attach_layerwise_casting_hooks(layer, torch.bfloat16, torch.float32, non_blocking=True)
    hook = layer._hf_hook
    assert isinstance(hook, SequentialHook) and isinstance(hook.hooks[1], LayerwiseCastingHook)
    assert hook.hooks[1].non_blocking is True
    layer(torch.ones(1, 2))
    assert calls == [torch.bfloat16]  # the earlier hook runs first, on the stored weights
    remove_hook_from_submodules(layer)
    assert not hasattr(layer, "_hf_hook") and layer.weight.dtype == torch.bfloat16


def test_supported_layers_are_the_matmul_and_convolution_ones() -> None:
    assert (
        nn.Linear in SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
        and nn.ConvTranspose3d in SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
    )
    assert (
        nn.LayerNorm not in SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
        and nn.Embedding not in SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
    )
