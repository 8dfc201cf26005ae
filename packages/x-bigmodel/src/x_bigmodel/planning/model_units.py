"""A model cut into placement units, with the bytes of each tensor and the groups sharing tensors.

A *unit* is a piece never split across devices: a leaf module, a module whose class is in
``no_split_module_classes``, or a tensor held directly by a module that is split. Units holding
one tensor (a tied embedding and LM head) form a group, placed together, the tensor counted once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from x_common.dtypes import tensor_nbytes
from x_common.module_sizes import TensorInfo, tensor_infos

__all__ = ["Unit", "UnitTable", "model_units", "no_split_set", "unit_table"]


@dataclass
class Unit:
    """One piece placed whole: a module, or a tensor of a split module, with the tensors it holds."""

    name: str
    module: torch.nn.Module | None  # None for a tensor placed on its own
    tensors: set[int] = field(default_factory=set)  # indices into the tensor list


def no_split_set(no_split_module_classes: Iterable[str] | str | None) -> set[str]:
    """The class names kept whole, from a name, names, or ``None``."""
    if no_split_module_classes is None:
        return set()
    if isinstance(no_split_module_classes, str):
        return {no_split_module_classes}
    return set(no_split_module_classes)


def model_units(model: torch.nn.Module, no_split: set[str]) -> list[Unit]:
    """The model cut into pieces that are never split, in model order."""

    def atomic(module: torch.nn.Module) -> bool:
        return type(module).__name__ in no_split or not any(True for _ in module.children())

    if atomic(model):
        return [Unit("", model)]
    units: list[Unit] = []

    def walk(module: torch.nn.Module, prefix: str) -> None:
        # Order as Accelerate: a module's own parameters, then its children, then its own buffers.
        units.extend(Unit(prefix + n, None) for n, _ in module.named_parameters(recurse=False))
        for name, child in module.named_children():
            if atomic(child):
                units.append(Unit(prefix + name, child))
            else:
                walk(child, f"{prefix}{name}.")
        units.extend(Unit(prefix + n, None) for n, _ in module.named_buffers(recurse=False))

    walk(model, "")
    return units


def tensor_bytes(info: TensorInfo, dtype: Any, special_dtypes: Mapping[str, Any] | None) -> int:
    """Bytes of one tensor once loaded as ``dtype``, or as the ``special_dtypes`` entry of one of its names."""
    if special_dtypes:
        for name in info.names:
            if name in special_dtypes:
                return tensor_nbytes(info.numel, special_dtypes[name])
    return info.nbytes(dtype)


@dataclass
class UnitTable:
    """The units of a model, the bytes of each distinct tensor, and the groups of units sharing tensors."""

    units: list[Unit]
    infos: list[TensorInfo]
    nbytes: list[int]
    groups: list[list[int]]  # unit indices sharing tensors, first unit first
    group_of: list[int]

    def group_size(self, group: int) -> int:
        tensors: set[int] = set()
        for u in self.groups[group]:
            tensors |= self.units[u].tensors
        return sum(self.nbytes[t] for t in tensors)

    def unit_size(self, unit: int) -> int:
        return sum(self.nbytes[t] for t in self.units[unit].tensors)


def unit_table(
    model: torch.nn.Module,
    no_split_module_classes: Iterable[str] | str | None,
    dtype: Any,
    special_dtypes: Mapping[str, Any] | None,
) -> UnitTable:
    """Cut ``model`` into units (``model_units``), size its tensors and group units sharing tensors."""
    units = model_units(model, no_split_set(no_split_module_classes))
    infos = tensor_infos(model)
    by_name = {u.name: i for i, u in enumerate(units)}
    parent = list(range(len(units)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for t, info in enumerate(infos):
        owners = []
        for name in info.names:
            parts = name.split(".")
            for cut in range(len(parts), -1, -1):
                owner = by_name.get(".".join(parts[:cut]))
                if owner is not None:
                    owners.append(owner)
                    units[owner].tensors.add(t)
                    break
        for other in owners[1:]:
            # Union towards the smaller index so the root of a group is its first unit.
            a, b = sorted((find(owners[0]), find(other)))
            parent[b] = a
    groups: dict[int, list[int]] = {}
    for i in range(len(units)):
        groups.setdefault(find(i), []).append(i)
    group_list = list(groups.values())
    group_of = [0] * len(units)
    for g, members in enumerate(group_list):
        for u in members:
            group_of[u] = g
    nbytes = [tensor_bytes(info, dtype, special_dtypes) for info in infos]
    return UnitTable(units, infos, nbytes, group_list, group_of)
