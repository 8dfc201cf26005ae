"""The largest unit a device map must keep whole.

A module whose class is in the model's ``_no_split_modules`` is never cut across devices
(a transformer block, BERT's embeddings); elsewhere each leaf module, and each tensor held
directly by a non-leaf module, can be placed on its own. The largest of these units is the
least memory any single device must have free. ``gathered_parameters`` answers the sharded
question instead: what a ZeRO-3 / FSDP device holds gathered whole at its peak.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["gathered_parameters", "largest_unit", "placement_units"]


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


def gathered_parameters(summary: Any) -> tuple[str, int]:
    """(what, parameter count) a ZeRO-3 / FSDP device holds gathered whole at its peak.

    FSDP wraps each block (a class in the model's ``_no_split_modules``, Accelerate's default
    wrapping) and then the root, which holds every parameter outside the blocks (embeddings, the
    final norm, the head; a tied weight once). The root is not resharded between forward and
    backward, and as backward starts the last block's parameters are gathered again: the root
    unit and one block are live at the usual peak (measured on a real FSDP2 step,
    tests/simulate/test_shard_accuracy.py). A model without such blocks is one unit, gathered whole.
    """
    blocks = [name for name, cls in summary.modules.items() if name and cls in set(summary.no_split)]
    prefixes = tuple(name + "." for name in blocks)

    def block_of(tensor_name: str) -> str | None:
        return next((b for b, p in zip(blocks, prefixes, strict=True) if tensor_name.startswith(p)), None)

    root = 0
    per_block: dict[str, int] = {}
    for t in summary.tensors:
        if not t.is_parameter:
            continue
        homes = {block_of(n) for n in t.names}
        if None in homes:
            root += t.numel  # outside every block (a weight tied into a block is the root's too)
        else:
            home = min(h for h in homes if h is not None)
            per_block[home] = per_block.get(home, 0) + t.numel
    if not per_block:
        return "the whole model", root
    largest = max(per_block.values())
    what = f"the root unit ({root:,} parameters outside the blocks) and one block ({largest:,})"
    return what, root + largest
