"""The largest unit a device map must keep whole.

A module whose class is in the model's ``_no_split_modules`` is never cut across devices
(a transformer block, BERT's embeddings); elsewhere each leaf module, and each tensor held
directly by a non-leaf module, can be placed on its own. The largest of these units is the
least memory any single device must have free.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from x_common.module_sizes import sizes_of

__all__ = ["largest_unit", "largest_unit_parameters", "placement_units"]


def _parent(name: str) -> str:
    return name.rpartition(".")[0]


def placement_units(modules: dict[str, str], tensor_names: Iterable[str], no_split: Iterable[str] = ()) -> list[str]:
    """Qualified names of the units a device map places, in module order.

    Args:
        modules: qualified module name -> class name, in module order (``""`` is the root).
        tensor_names: every parameter and buffer name.
        no_split: class names that must stay whole.

    Examples:
        >>> mods = {"": "Net", "blocks": "ModuleList", "blocks.0": "Block", "blocks.0.fc": "Linear", "head": "Linear"}
        >>> placement_units(mods, ["blocks.0.fc.weight", "head.weight", "scale"], no_split=["Block"])
        ['scale', 'blocks.0', 'head']
    """
    whole = set(no_split)
    children: dict[str, list[str]] = {name: [] for name in modules}
    for name in modules:
        if name:
            children.setdefault(_parent(name), []).append(name)
    direct: dict[str, list[str]] = {}
    for tensor in tensor_names:
        direct.setdefault(_parent(tensor), []).append(tensor)

    units: list[str] = []

    def walk(name: str) -> None:
        if modules.get(name) in whole or not children.get(name):
            units.append(name)
            return
        units.extend(direct.get(name, []))
        for child in children[name]:
            walk(child)

    walk("")
    return list(dict.fromkeys(units))


def largest_unit(sizes: dict[str, int], units: list[str]) -> tuple[str, int]:
    """(name, bytes) of the largest unit; ties go to the first in module order.

    Examples:
        >>> largest_unit({"": 30, "a": 10, "b": 20}, ["a", "b"])
        ('b', 20)
    """
    best_name, best_size = "", -1
    for name in units:
        size = sizes.get(name, 0)
        if size > best_size:
            best_name, best_size = name, size
    return best_name, max(best_size, 0)


def largest_unit_parameters(summary: Any) -> tuple[str, int]:
    """(name, parameter count) of a ``ModelSummary``'s largest unit (by float32 bytes), the one
    ZeRO-3 / FSDP gather whole."""
    names = [n for t in summary.tensors for n in t.names]
    units = placement_units(summary.modules, names, summary.no_split)
    unit, _ = largest_unit(sizes_of(summary.tensors, "float32"), units)
    prefix = unit + "."
    count = sum(
        t.numel
        for t in summary.tensors
        if t.is_parameter and any(not unit or n == unit or n.startswith(prefix) for n in t.names)
    )
    return unit, count
