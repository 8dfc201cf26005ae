"""The tensors ``dispatch_model`` places, and where each one's value comes from.

A tensor is handled once whatever its number of names (``AliasGroup``); a resident one is put on
its device (``materialise``), an offloaded one becomes a meta tensor whose value is read from
``state_dict``, the offload index or its current place (``source_for``) by the hook of the unit
that uses it (``UnitFinder``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from x_bigmodel.devices.tensor_placement import assign_tensor, owner_of, wrap_like
from x_bigmodel.offload.blocks import WeightGroup
from x_bigmodel.offload.weights import FileWeight, MemoryWeight
from x_bigmodel.planning.device_plan import DevicePlan

__all__ = [
    "AliasGroup",
    "ResidentTensor",
    "UnitFinder",
    "alias_groups",
    "assign_entries",
    "is_module",
    "materialise",
    "meta_like",
    "named_tensors",
    "source_for",
]


@dataclass(frozen=True, kw_only=True)
class AliasGroup:
    """One tensor of the model under all of its names, and whether it is a buffer."""

    names: list[str]
    tensor: torch.Tensor
    is_buffer: bool


@dataclass(frozen=True, kw_only=True)
class ResidentTensor:
    """A tensor kept on a device for good (not offloaded): all its names and that device."""

    names: list[str]
    device: torch.device


def alias_groups(model: nn.Module) -> list[AliasGroup]:
    """Every distinct tensor of ``model`` (parameters, then buffers) with all of its names."""
    buffers = {id(b) for _, b in model.named_buffers(remove_duplicate=False) if b is not None}
    by_id: dict[int, AliasGroup] = {}
    for name, tensor in named_tensors(model):
        group = by_id.setdefault(id(tensor), AliasGroup(names=[], tensor=tensor, is_buffer=id(tensor) in buffers))
        group.names.append(name)
    return list(by_id.values())


def assign_entries(model: nn.Module, plan: DevicePlan) -> dict[str, str]:
    """Each tensor name to the device-map entry that places it (the longest prefix)."""
    result: dict[str, str] = {}
    for name, _ in named_tensors(model):
        entry = plan.entry_for(name)
        if entry is None:
            raise ValueError(f"{name} has no device in device_map")
        result[name] = entry
    return result


def named_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    # Every name of every tensor, non-persistent buffers included (they are not in state_dict).
    named: list[tuple[str, torch.Tensor]] = list(model.named_parameters(remove_duplicate=False))
    named += [(n, b) for n, b in model.named_buffers(remove_duplicate=False) if b is not None]
    return named


def is_module(model: nn.Module, name: str) -> bool:
    try:
        model.get_submodule(name)
    except AttributeError:
        return False
    return True


class UnitFinder:
    """Which module's hook brings in an offloaded tensor: going down from its device-map entry to
    the tensor's own module, the first module that is of a unit class (no-split or preload) or a
    leaf; else the tensor's own module (a tensor held directly by a split module).

    Containers are never units (a ``ModuleList`` is never called, so a hook on it would never run),
    and neither is a module of no unit class with children: its forward calls them, and each child
    brings in its own weights, one at a time.
    """

    def __init__(self, model: nn.Module, unit_classes: set[str]) -> None:
        self.model, self.unit_classes = model, unit_classes

    def unit_for(self, entry: str, name: str) -> str:
        owner = name.rpartition(".")[0]
        if not is_module(self.model, entry):
            return owner  # the entry is a tensor: its module's hook brings it in
        prefix = entry
        path = owner[len(entry) :].lstrip(".").split(".") if owner != entry else []
        for part in [None, *path]:
            if part is not None:
                prefix = f"{prefix}.{part}" if prefix else part
            module = self.model.get_submodule(prefix)
            if type(module).__name__ in self.unit_classes or next(module.children(), None) is None:
                return prefix
        return owner


def meta_like(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # Between forwards the slot shows the shape and dtype the forward will see, on meta.
    if tensor.device.type == "meta" and tensor.dtype == dtype:
        return tensor
    return wrap_like(tensor, torch.empty(tensor.shape, dtype=dtype, device="meta"))


def source_for(
    group: WeightGroup, file_sources: Mapping[str, FileWeight], state_dict: Mapping[str, torch.Tensor] | None
) -> MemoryWeight | FileWeight:
    for name in group.names:
        if state_dict is not None and name in state_dict:
            return MemoryWeight(state_dict[name].to(group.template.dtype))
    for name in group.names:
        if name in file_sources:
            return file_sources[name]
    if group.template.device.type != "meta":
        return MemoryWeight(group.template.detach().to("cpu"))
    raise ValueError(
        f"{group.names[0]} is offloaded but has no value: it is on the meta device and neither in the "
        "offload index nor in state_dict (was the checkpoint loaded with this device map?)"
    )


def materialise(
    model: nn.Module,
    names: list[str],
    device: torch.device,
    sources: Mapping[str, FileWeight],
    state_dict: Mapping[str, torch.Tensor] | None,
) -> None:
    """Put a resident tensor (all its aliases) on ``device``.

    Its value comes from the offload index when listed there (a buffer of a disk module kept on
    the execution device: in a meta-built model it holds only its initial value), else from
    ``state_dict``, else from where it is now.
    """
    owner, leaf = owner_of(model, names[0])
    current = getattr(owner, leaf)
    found = [n for n in names if n in sources]
    if found:
        source = sources[found[0]]
        value = source.file.read(source.key).to(device=device, dtype=source.dtype)
    elif state_dict is not None and names[0] in state_dict:
        value = state_dict[names[0]].to(device=device, dtype=current.dtype)
    elif current.device.type == "meta":
        raise ValueError(
            f"{names[0]} is on the meta device with no value to load: it is not in the checkpoint's "
            "offload index nor in state_dict"
        )
    elif current.device == device:
        return
    else:
        value = current.detach().to(device)
    live = wrap_like(current, value)
    for name in names:
        assign_tensor(*owner_of(model, name), live)
