"""fp8 mixed precision: recipe objects, the hardware check, and the torchao conversion.

fp8 matmuls need an NVIDIA GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell).
Everywhere else ``mixed_precision="fp8"`` is refused before anything is built, naming the
device and the alternative. On fp8 hardware the model's ``Linear`` layers are converted by
torchao (``convert_to_float8_training``) and the rest runs under bf16 autocast.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import torch

from x_runtime.core.configs import AORecipeKwargs, TERecipeKwargs

__all__ = ["AORecipeKwargs", "TERecipeKwargs", "apply_fp8", "check_fp8", "fp8_recipe", "fp8_recipe_for"]

_MIN_CAPABILITY = (8, 9)


def fp8_recipe(handler: AORecipeKwargs | TERecipeKwargs | None) -> AORecipeKwargs:
    """The torchao recipe given in ``kwargs_handlers`` (a default one if none).

    Raises:
        ValueError: a Transformer Engine recipe was given.
    """
    if isinstance(handler, TERecipeKwargs):
        raise ValueError(
            "TERecipeKwargs: x_runtime runs fp8 through torchao; pass AORecipeKwargs() (pip install torchao)"
        )
    return handler or AORecipeKwargs()


def check_fp8(device: torch.device) -> None:
    """Refuse fp8 where it cannot run, with what to use instead.

    Raises:
        ValueError: not an NVIDIA GPU, one older than compute capability 8.9, or no torchao.
    """
    if device.type != "cuda":
        raise ValueError(
            f"mixed_precision='fp8' needs an NVIDIA GPU of compute capability >= 8.9 (H100, L4, RTX 4090); this "
            f"run computes on {device.type}: use 'bf16'"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < _MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise ValueError(
            f"mixed_precision='fp8' needs compute capability >= 8.9; {name} has {capability[0]}.{capability[1]}: "
            "use 'bf16'"
        )
    if importlib.util.find_spec("torchao") is None:
        raise ValueError("mixed_precision='fp8' needs torchao: pip install torchao")


def _default_filter(model: torch.nn.Module) -> Callable[[torch.nn.Module, str], bool]:
    linears = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    edges = {linears[0], linears[-1]} if linears else set()

    def keep(module: torch.nn.Module, name: str) -> bool:
        if not isinstance(module, torch.nn.Linear) or name in edges:
            return False
        return module.in_features % 16 == 0 and module.out_features % 16 == 0

    return keep


def apply_fp8(model: torch.nn.Module, recipe: AORecipeKwargs) -> torch.nn.Module:
    """Convert ``model``'s ``Linear`` layers to torchao's fp8 training layers in place."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = recipe.config or Float8LinearConfig()
    keep = recipe.module_filter_func or _default_filter(model)
    convert_to_float8_training(model, config=config, module_filter_fn=keep)
    return model


def fp8_recipe_for(mode: str, device: torch.device, handler: Any) -> AORecipeKwargs | None:
    """The recipe to apply when ``mode`` is "fp8" (checked against ``device``), else None."""
    if str(mode).lower() != "fp8":
        return None
    recipe = fp8_recipe(handler)
    check_fp8(device)
    return recipe
