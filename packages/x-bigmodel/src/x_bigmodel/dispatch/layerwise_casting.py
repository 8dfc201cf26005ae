"""Layerwise casting: weights stored in a small dtype, each layer cast up only for its own forward.

A model kept in ``float8_e4m3fn`` (or ``float16``) and computed in ``bfloat16``/``float32`` needs the
memory of the small dtype plus one layer in the large one. Only layers whose weights feed a matmul
or a convolution are cast (``SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING``): normalisation layers and
embeddings keep their dtype, since rounding them costs accuracy and saves little. Accelerate's names
and meaning (``accelerate.hooks.LayerwiseCastingHook``, ``accelerate.big_modeling.attach_layerwise_casting_hooks``).

Examples:
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    >>> attach_layerwise_casting_hooks(model, storage_dtype=torch.float16, compute_dtype=torch.float32)
    >>> model[0].weight.dtype, model[1].weight.dtype
    (torch.float16, torch.float32)
    >>> model(torch.ones(2, 3)).dtype, model[0].weight.dtype
    (torch.float32, torch.float16)
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from x_bigmodel.dispatch.hooks import ModelHook, add_hook_to_module

__all__ = ["SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING", "LayerwiseCastingHook", "attach_layerwise_casting_hooks"]

SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING: tuple[type[nn.Module], ...] = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.Linear,
)


class LayerwiseCastingHook(ModelHook):
    """Keeps a module in ``storage_dtype``; casts it to ``compute_dtype`` for the length of its forward.

    Args:
        storage_dtype: the dtype the weights live in between forwards.
        compute_dtype: the dtype the forward computes in (the inputs' dtype).
        non_blocking: asynchronous casts (``Module.to(non_blocking=...)``).
    """

    def __init__(self, storage_dtype: torch.dtype, compute_dtype: torch.dtype, non_blocking: bool) -> None:
        self.storage_dtype = storage_dtype
        self.compute_dtype = compute_dtype
        self.non_blocking = non_blocking

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)

    # Kept out of torch.compile graphs: an in-place dtype change of the module's own parameters
    # is a side effect a graph cannot replay.
    @torch.compiler.disable
    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        module.to(dtype=self.compute_dtype, non_blocking=self.non_blocking)
        return args, kwargs

    @torch.compiler.disable
    def post_forward(self, module: nn.Module, output: Any) -> Any:
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return output


def attach_layerwise_casting_hooks(
    module: nn.Module,
    storage_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    skip_modules_pattern: str | tuple[str, ...] | list[str] | None = None,
    skip_modules_classes: tuple[type[nn.Module], ...] | None = None,
    non_blocking: bool = False,
) -> None:
    """Store every castable layer of ``module`` in ``storage_dtype``, computing in ``compute_dtype``.

    Args:
        module: the model; its ``SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING`` layers get a
            ``LayerwiseCastingHook`` (added after any hook already there).
        storage_dtype: dtype between forwards, e.g. ``torch.float8_e4m3fn``.
        compute_dtype: dtype during the forward, e.g. ``torch.bfloat16``.
        skip_modules_pattern: regular expressions searched in each module's qualified name
            (``"decoder.norm"``); a match keeps that module and everything under it as it is.
        skip_modules_classes: module classes kept as they are, with everything under them.
        non_blocking: asynchronous casts.
    """
    patterns = (skip_modules_pattern,) if isinstance(skip_modules_pattern, str) else tuple(skip_modules_pattern or ())
    skip_classes = tuple(skip_modules_classes or ())
    pending: list[tuple[str, nn.Module]] = [("", module)]
    while pending:  # depth first, without recursion: deep models do not hit the recursion limit
        name, current = pending.pop()
        if (skip_classes and isinstance(current, skip_classes)) or any(re.search(p, name) for p in patterns):
            continue
        if isinstance(current, SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING):
            add_hook_to_module(current, LayerwiseCastingHook(storage_dtype, compute_dtype, non_blocking), append=True)
            continue
        children = [(f"{name}.{child}" if name else child, sub) for child, sub in current.named_children()]
        pending.extend(reversed(children))
