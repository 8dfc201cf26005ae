"""``cpu_offload_with_hook``: a whole model kept in RAM, brought to the execution device by its first
forward and left there until its hook's ``offload()``, or until the next model of a chain runs.

Accelerate's semantics (``accelerate.big_modeling.cpu_offload_with_hook``): for pipelines that run
one model many times, then the next (a diffusion pipeline's text encoder, UNet, VAE), moving a
whole model once per stage instead of each block at each forward as ``cpu_offload`` does::

    encoder, hook_1 = cpu_offload_with_hook(encoder, 0)
    unet, hook_2 = cpu_offload_with_hook(unet, 0, prev_module_hook=hook_1)
    hidden = encoder(ids)             # encoder -> GPU 0
    for _ in range(50):
        latents = unet(latents)       # first call: encoder -> CPU, unet -> GPU 0; then no moves
    hook_2.offload()                  # unet -> CPU: the last model is offloaded by hand
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from x_bigmodel.devices.device_moves import send_to_device
from x_bigmodel.devices.tensor_placement import as_device
from x_bigmodel.dispatch.hooks import ModelHook, add_hook_to_module, remove_hook_from_module
from x_bigmodel.dispatch.whole_model import default_accelerator

__all__ = ["CpuOffload", "UserCpuOffloadHook", "cpu_offload_with_hook"]

_CPU = torch.device("cpu")


class UserCpuOffloadHook:
    """What ``cpu_offload_with_hook`` returns: the model and its hook, with ``offload()`` (the
    model back to the CPU) and ``remove()`` (the hook taken off; the model stays where it is)."""

    def __init__(self, model: nn.Module, hook: CpuOffload) -> None:
        self.model = model
        self.hook = hook

    def offload(self) -> None:
        """Move the model back to the CPU; its next forward brings it to the execution device again."""
        self.hook.init_hook(self.model)

    def remove(self) -> None:
        """Remove the hook (and any other hook on the model): its forwards no longer move it."""
        remove_hook_from_module(self.model)


class CpuOffload(ModelHook):
    """Moves the module to the CPU when attached and to ``execution_device`` at its forward (with
    the forward's inputs); after the forward it stays there. Before that, the model of
    ``prev_module_hook`` is offloaded to the CPU if it is not there already.

    ``execution_device`` defaults to the first accelerator here (MPS, or CUDA device 0), else the
    CPU, as Accelerate's ``PartialState().default_device``.
    """

    def __init__(
        self,
        execution_device: int | str | torch.device | None = None,
        prev_module_hook: UserCpuOffloadHook | None = None,
    ) -> None:
        self.prev_module_hook = prev_module_hook
        self.execution_device = as_device(execution_device) if execution_device is not None else default_accelerator()

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to(_CPU)

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        previous = self.prev_module_hook
        if isinstance(previous, UserCpuOffloadHook) and _device_of(previous.model) not in (None, _CPU):
            previous.offload()
            if torch.accelerator.is_available():
                torch.accelerator.empty_cache()
        if _is_on(_device_of(module), self.execution_device):
            return args, kwargs
        module.to(self.execution_device)
        return send_to_device(args, self.execution_device), send_to_device(kwargs, self.execution_device)


def _device_of(module: nn.Module) -> torch.device | None:
    """The device of the module's first parameter (first buffer without parameters), as Accelerate
    reads it; ``None`` for a module holding no tensor."""
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return None


def _is_on(device: torch.device | None, target: torch.device) -> bool:
    # "cuda" (no index) as the execution device matches the weights' "cuda:0".
    return device is not None and device.type == target.type and target.index in (None, device.index)


def cpu_offload_with_hook(
    model: nn.Module,
    execution_device: int | str | torch.device | None = None,
    prev_module_hook: UserCpuOffloadHook | None = None,
) -> tuple[nn.Module, UserCpuOffloadHook]:
    """Offload ``model`` to the CPU; its forward brings it to ``execution_device``, where it stays.

    Unlike ``cpu_offload``, the model is moved whole, once: it goes back to the CPU when the
    returned hook's ``offload()`` is called, or just before the forward of a model given this hook
    as ``prev_module_hook`` (a chain of models run one after the other). The hook is appended to
    any hook the model already has; ``hook.remove()`` removes them all, as in Accelerate.

    Args:
        model: the model, with its weights loaded (on any device).
        execution_device: where the forward runs; default: the first accelerator here (MPS, or
            CUDA device 0), else the CPU.
        prev_module_hook: the hook returned for the previous model of the chain.

    Returns:
        ``(model, hook)``: the model, now on the CPU, and its ``UserCpuOffloadHook``.

    Examples:
        >>> first, hook_1 = cpu_offload_with_hook(nn.Linear(2, 2), "cpu")
        >>> second, hook_2 = cpu_offload_with_hook(nn.Linear(2, 2), "cpu", prev_module_hook=hook_1)
        >>> second(first(torch.ones(1, 2))).shape, hook_2.hook.prev_module_hook is hook_1
        (torch.Size([1, 2]), True)
        >>> hook_2.offload(); hook_2.remove()
    """
    hook = CpuOffload(execution_device=execution_device, prev_module_hook=prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)
