"""Accelerate's helpers around ``AlignDevicesHook``: ``attach_align_device_hook`` (a hook on every
module holding weights), ``has_offloaded_params``, ``align_module_device`` (an offloaded module's
weights in place for a block of code) and ``get_state_dict_offloaded_model``.

They work on the hooks ``dispatch_model``/``cpu_offload``/``disk_offload`` put on a model as on the
ones ``attach_align_device_hook`` does: both keep an offloaded module's weights in an
``OffloadedBlock``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from x_bigmodel.devices.tensor_placement import as_device, set_module_tensor_to_device
from x_bigmodel.dispatch.align_hook import AlignDevicesHook
from x_bigmodel.dispatch.hooks import SequentialHook, add_hook_to_module
from x_bigmodel.offload.blocks import Fetched
from x_bigmodel.offload.offload_files import PrefixedDataset

__all__ = [
    "align_module_device",
    "attach_align_device_hook",
    "get_state_dict_from_offload",
    "get_state_dict_offloaded_model",
    "has_offloaded_params",
]


def attach_align_device_hook(
    module: nn.Module,
    execution_device: int | str | torch.device | None = None,
    offload: bool = False,
    weights_map: Mapping[str, torch.Tensor] | None = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: str | Collection[str] | None = None,
    preload_module_classes: Collection[str] | None = None,
    tied_params_map: Mapping[Any, Any] | None = None,
) -> None:
    """Add an ``AlignDevicesHook`` to every module of ``module`` that holds parameters itself.

    With ``offload`` their weights are kept off ``execution_device`` between forwards (read from
    ``weights_map``, named from ``module``'s root, when given); a module whose class is in
    ``preload_module_classes`` brings in its whole subtree's weights for its forward, and no hook is
    put below it. A hook already on a module is kept, the new one run after it.
    """
    own = next(module.parameters(recurse=False), None) is not None
    whole = offload and type(module).__name__ in set(preload_module_classes or ())
    if own or whole:
        prefix = f"{module_name}." if module_name else ""
        hook = AlignDevicesHook(
            execution_device,
            offload=offload,
            weights_map=PrefixedDataset(weights_map, prefix) if weights_map is not None else None,
            offload_buffers=offload_buffers,
            place_submodules=whole,
            skip_keys=skip_keys,
            tied_params_map=tied_params_map,
        )
        add_hook_to_module(module, hook, append=True)
    if whole:
        return
    for name, child in module.named_children():
        attach_align_device_hook(
            child,
            execution_device=execution_device,
            offload=offload,
            weights_map=weights_map,
            offload_buffers=offload_buffers,
            module_name=f"{module_name}.{name}" if module_name else name,
            skip_keys=skip_keys,
            preload_module_classes=preload_module_classes,
            tied_params_map=tied_params_map,
        )


def _align_hook(module: nn.Module) -> AlignDevicesHook | None:
    hook = getattr(module, "_hf_hook", None)
    hooks = hook.hooks if isinstance(hook, SequentialHook) else [hook]
    for candidate in hooks:
        if isinstance(candidate, AlignDevicesHook) and candidate.offload:
            return candidate
    return None


def has_offloaded_params(module: nn.Module) -> bool:
    """Whether ``module`` has an ``AlignDevicesHook`` keeping its weights offloaded."""
    return _align_hook(module) is not None


@contextlib.contextmanager
def align_module_device(module: nn.Module, execution_device: int | str | torch.device | None = None) -> Iterator[None]:
    """Within the block, ``module``'s weights are real tensors: an offloaded module's are brought in
    (onto ``execution_device``, default its hook's execution device) and offloaded again after;
    another module's own parameters are moved to ``execution_device`` (when given) and back."""
    hook = _align_hook(module)
    block = hook.block if hook is not None else None
    if block is not None:
        device = as_device(execution_device) if execution_device is not None else block.device
        if block.depth:  # inside the module's forward: its weights are in already
            yield
            return
        block.install(Fetched(block, [group.source.fetch(device) for group in block.groups]))
        block.depth += 1
        try:
            yield
        finally:
            block.depth -= 1
            block.release(pages=False)
            for group in block.groups:
                group.source.release(device)
        return
    if execution_device is None:
        yield
        return
    device = as_device(execution_device)
    moved = {name: p.detach() for name, p in module.named_parameters(recurse=False) if p.device.type != "meta"}
    for name in moved:
        set_module_tensor_to_device(module, name, device)
    try:
        yield
    finally:
        # Values changed in the block go back with the tensors; from "meta", the originals do.
        for name, original in moved.items():
            on_meta = getattr(module, name).device.type == "meta"
            set_module_tensor_to_device(module, name, original.device, value=original if on_meta else None)


def get_state_dict_offloaded_model(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state dict on the CPU, offloaded weights read back one module at a time.

    Raises:
        ValueError: a tensor is on the meta device with no offloading hook to read it from.
    """
    order = list(model.state_dict(keep_vars=True))
    result: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if tensor.device.type != "meta":
            result[name] = tensor.detach().to("cpu")
    for module_name, module in model.named_modules(remove_duplicate=False):
        if not has_offloaded_params(module):
            continue
        prefix = f"{module_name}." if module_name else ""
        with align_module_device(module, "cpu"):
            for name, tensor in module.state_dict(prefix=prefix, keep_vars=True).items():
                if name not in result and tensor.device.type != "meta":
                    result[name] = tensor.detach().clone()
    missing = [name for name in order if name not in result]
    if missing:
        raise ValueError(f"{missing[0]} is on the meta device and no offloading hook holds its value")
    return {name: result[name] for name in order}


def get_state_dict_from_offload(
    module: nn.Module,
    module_name: str,
    state_dict: dict[str, Any],
    device_to_put_offload: int | str | torch.device = "cpu",
) -> dict[str, Any]:
    """``state_dict`` with the entries of ``module`` (named ``module_name``, e.g. ``"linear1.weight"``)
    filled with its tensors: an offloaded module's read back onto ``device_to_put_offload``, another
    module's as they are. Accelerate's helper behind ``get_state_dict_offloaded_model``.

    Examples:
        >>> layer = nn.Linear(2, 2)
        >>> got = get_state_dict_from_offload(layer, "fc.weight", {"fc.weight": "placeholder", "fc.bias": None})
        >>> [tuple(got[k].shape) for k in ("fc.weight", "fc.bias")]
        [(2, 2), (2,)]
    """
    root = module_name[: module_name.rfind(".")]  # the module's own name, without ".weight"
    device = device_to_put_offload if has_offloaded_params(module) else None
    with align_module_device(module, device):
        for key, tensor in module.state_dict().items():
            if f"{root}.{key}" in state_dict:
                state_dict[f"{root}.{key}"] = tensor
    return state_dict
