"""``extract_model_from_parallel``: Accelerate's name for what ``Accelerator.unwrap_model`` does."""

from __future__ import annotations

from typing import Any

import torch

from x_runtime.core.unwrap import unwrap_model
from x_runtime.precision.policy import unwrap_forward

__all__ = ["extract_model_from_parallel"]


def extract_model_from_parallel(
    model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True, recursive: bool = False
) -> Any:
    """The user's model inside DDP, ``DataParallel``, a DeepSpeed engine (and ``torch.compile``).

    Args:
        model: a prepared (or wrapped) model.
        keep_fp32_wrapper: keep the mixed-precision forward ``prepare`` put on the model.
        keep_torch_compile: return the compiled wrapper when the model was compiled whole.
        recursive: also replace every submodule held by such a wrapper with the module inside.

    Examples:
        >>> inner = torch.nn.Linear(1, 1)
        >>> extract_model_from_parallel(torch.nn.DataParallel(inner)) is inner
        True
    """
    inner = unwrap_model(model, keep_torch_compile=keep_torch_compile)
    if recursive:
        _unwrap_children(unwrap_model(inner))
    if not keep_fp32_wrapper:
        unwrap_forward(unwrap_model(inner))
    return inner


def _unwrap_children(module: torch.nn.Module) -> None:
    for name, child in list(module.named_children()):
        plain = unwrap_model(child)
        if plain is not child:
            setattr(module, name, plain)
        _unwrap_children(plain)
