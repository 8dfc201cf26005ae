"""Hooks around a module's forward, with Accelerate's names: ``ModelHook``, ``add_hook_to_module``,
``remove_hook_from_module``; the hook is reachable as ``module._hf_hook``, where transformers
looks for it.

Hooks are installed with PyTorch's own forward hooks rather than by replacing ``module.forward``:
the post-forward half is registered with ``always_call=True``, so it runs even when the forward
raises an exception, and weights brought in for an offloaded block are released (Accelerate's
replaced forward skips its post-forward on an exception, leaving them in memory). A
``KeyboardInterrupt`` skips PyTorch's hooks too; ``dispatch_model``'s root hook then releases what
was left in at the start of the next forward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = [
    "ModelHook",
    "SequentialHook",
    "add_hook_to_module",
    "remove_hook_from_module",
    "remove_hook_from_submodules",
]

_HANDLES = "_x_hook_handles"


class ModelHook:
    """Base class: override what you need. ``pre_forward`` returns ``(args, kwargs)``;
    ``post_forward`` returns the output to hand back. With ``no_grad`` the module's own forward
    (not the hook's two halves) runs without recording gradients, as Accelerate's."""

    no_grad = False

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        return module


class SequentialHook(ModelHook):
    """Several hooks run in order (``post_forward`` in the same order, as Accelerate's)."""

    def __init__(self, *hooks: ModelHook) -> None:
        self.hooks = list(hooks)

    def init_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Run ``hook`` around every call of ``module``; replaces an existing hook unless ``append``.

    Examples:
        >>> import torch
        >>> class Double(ModelHook):
        ...     def post_forward(self, module, output):
        ...         return output * 2
        >>> layer = add_hook_to_module(nn.Identity(), Double())
        >>> layer(torch.ones(2)).tolist()
        [2.0, 2.0]
        >>> remove_hook_from_module(layer)(torch.ones(2)).tolist()
        [1.0, 1.0]
    """
    existing = getattr(module, "_hf_hook", None)
    if existing is not None:
        remove_hook_from_module(module)
        if append:
            hook = SequentialHook(*(existing.hooks if isinstance(existing, SequentialHook) else [existing]), hook)
    module = hook.init_hook(module)
    # Grad modes before the forwards running under no_grad, innermost last: a module may call itself.
    grad_modes: list[bool] = []

    def pre(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        args, kwargs = hook.pre_forward(mod, *args, **kwargs)
        if hook.no_grad:
            grad_modes.append(torch.is_grad_enabled())
            torch.set_grad_enabled(False)
        return args, kwargs

    def post(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        # Runs after an exception in the forward too (always_call): the grad mode is always restored.
        if grad_modes:
            torch.set_grad_enabled(grad_modes.pop())
        return hook.post_forward(mod, output)

    handles = (
        module.register_forward_pre_hook(pre, with_kwargs=True, prepend=True),
        module.register_forward_hook(post, with_kwargs=True, always_call=True),
    )
    module._hf_hook = hook  # type: ignore[assignment]
    setattr(module, _HANDLES, handles)
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Remove the hook of ``module`` (and of all its submodules with ``recurse=True``).

    The hook's ``detach_hook`` runs first: an offloading hook puts back weights it was holding in
    memory, so the module works on its own again.
    """
    hook = getattr(module, "_hf_hook", None)
    if hook is not None:
        hook.detach_hook(module)
        for handle in getattr(module, _HANDLES, ()):
            handle.remove()
        for attribute in ("_hf_hook", _HANDLES):
            if attribute in module.__dict__:
                delattr(module, attribute)
    if "_old_forward" in module.__dict__:
        # A hook Accelerate's add_hook_to_module installed (transformers does during generate): it
        # replaced forward and kept the original.
        module.forward = module.__dict__.pop("_old_forward")
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse=True)
    return module


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Remove the hooks of ``module`` and of every module below it (Accelerate's name for the recursion).

    Examples:
        >>> model = nn.Sequential(add_hook_to_module(nn.Identity(), ModelHook()))
        >>> remove_hook_from_submodules(model)
        >>> hasattr(model[0], "_hf_hook")
        False
    """
    remove_hook_from_module(module, recurse=True)
