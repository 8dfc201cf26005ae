"""``infer_auto_device_map``: place a model's modules on GPUs first, then CPU RAM, then disk.

A *device map* maps module (or tensor) names to a device: an ``int`` for a CUDA device, or
``"mps"``, ``"cpu"``, ``"disk"``; ``""`` names the whole model. Sizes come from
``x_common.module_sizes``, so a meta-device skeleton (``init_empty_weights``) is enough.

The planner works on *units*: modules that must not be split (leaf modules and modules whose
class is in ``no_split_module_classes``), and tensors held directly by a module that is split.
Units are placed in model order on the first device that still has room; a planner never goes
back to an earlier device, so consecutive layers share a device and activations cross devices
as rarely as possible. Units sharing a tensor (a tied embedding and LM head) form one group that
goes to the device of the group's first unit, its shared tensors counted once.

Differences from Accelerate's ``infer_auto_device_map``:

* tied tensors are counted once, and every unit holding them is placed with the first one;
* room for the largest layer still to be placed is kept free on the execution device (the
  first GPU, or MPS) only when something is actually offloaded to CPU or disk, and on the CPU
  only when something goes to disk: that room is where offloaded weights are brought in for
  their forward. Accelerate keeps it always, even when the whole model fits on the GPUs;
* disk is used only when ``max_memory`` names a ``"disk"`` budget (offloading to disk needs a
  folder, which the caller should choose); a model that does not fit raises ``ValueError``.
  ``load_checkpoint_and_dispatch`` and ``dispatch_model`` given an offload folder add disk last
  with no limit (``budgets.with_disk``), as Accelerate's planner always does.
"""

from __future__ import annotations

import heapq
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from x_bigmodel.devices.device_keys import DeviceKey
from x_bigmodel.planning.budgets import get_max_memory
from x_bigmodel.planning.model_units import UnitTable, unit_table
from x_common.sizes import format_size

__all__ = ["clean_device_map", "fits", "infer_auto_device_map"]


def _fill(
    plan: UnitTable,
    budgets: dict[DeviceKey, int],
    reserve_on: set[DeviceKey],
    verbose: bool,
    fallback: bool = False,
) -> dict[int, DeviceKey]:
    devices = list(budgets)
    # The largest unit not placed yet is what may have to be brought in for its forward later.
    pending = [(-plan.unit_size(u), u) for u in range(len(plan.units))]
    heapq.heapify(pending)
    used = dict.fromkeys(devices, 0)
    placed: dict[int, DeviceKey] = {}
    current = 0
    for u in range(len(plan.units)):
        if u in placed:
            continue
        group = plan.group_of[u]
        size = plan.group_size(group)
        while pending and (pending[0][1] in placed or plan.group_of[pending[0][1]] == group):
            heapq.heappop(pending)
        reserve = -pending[0][0] if pending else 0
        while True:
            if current == len(devices):
                raise ValueError(_no_room_message(plan, plan.groups[group], size, budgets))
            device = devices[current]
            limit = budgets[device] - (reserve if device in reserve_on else 0)
            if used[device] + size <= limit:
                break
            if fallback and used[device] == 0 and device != "disk":
                # Rather than leave this device empty, put the first later group that fits on it.
                other = next(
                    (
                        g
                        for g in dict.fromkeys(plan.group_of[v] for v in range(u + 1, len(plan.units)))
                        if g != group
                        and plan.groups[g][0] not in placed
                        and plan.group_size(g) <= limit
                        and plan.group_size(g) > 0
                    ),
                    None,
                )
                if other is not None:
                    used[device] += plan.group_size(other)
                    for member in plan.groups[other]:
                        placed[member] = device
                    if verbose:
                        names = ", ".join(plan.units[m].name or "<model>" for m in plan.groups[other])
                        print(f"{names} ({format_size(plan.group_size(other))}) -> {device!r} (fallback allocation)")
                    continue
            if verbose:
                print(
                    f"{plan.units[u].name or '<model>'} ({format_size(size)}) does not fit on {device!r} "
                    f"({format_size(max(0, limit - used[device]))} left); next device"
                )
            current += 1
        used[device] += size
        for member in plan.groups[group]:
            placed[member] = device
        if verbose:
            names = ", ".join(plan.units[m].name or "<model>" for m in plan.groups[group])
            print(f"{names} ({format_size(size)}) -> {device!r}")
    return placed


def _no_room_message(plan: UnitTable, members: list[int], size: int, budgets: dict[DeviceKey, int]) -> str:
    names = " + ".join(repr(plan.units[m].name) for m in members)
    largest_device = max(budgets, key=lambda d: budgets[d]) if budgets else None
    largest = budgets[largest_device] if largest_device is not None else 0
    message = f"cannot place module {names} ({format_size(size)}): "
    if size > largest:
        message += f"it is larger than the largest budget, {format_size(largest)} on {largest_device!r}"
    else:
        total = sum(plan.nbytes)
        message += (
            f"every device is full; the model needs {format_size(total)} and the budgets add up to "
            f"{format_size(sum(budgets.values()))}, less room kept free to load offloaded layers"
        )
    if "disk" not in budgets:
        message += (
            "; give a 'disk' budget in max_memory to offload the rest to disk (or offload_folder= to "
            "load_checkpoint_and_dispatch or dispatch_model, which puts the rest on disk in that folder)"
        )
    return message


def _clean(device_map: dict[str, DeviceKey]) -> dict[str, DeviceKey]:
    """Replace entries by their parent's when all entries under that parent share one device."""
    result = dict(device_map)
    parents: set[str] = set()
    for name in result:
        parts = name.split(".") if name else []
        parents.update(".".join(parts[:i]) for i in range(len(parts)))
    for parent in sorted(parents, key=lambda p: -(p.count(".") + 1) if p else 0):
        under = [k for k in result if not parent or k == parent or k.startswith(parent + ".")]
        values = {result[k] for k in under}
        if len(values) == 1 and under != [parent]:
            value = values.pop()
            position = next(i for i, k in enumerate(result) if k in under)
            items = [(k, v) for k, v in result.items() if k not in under]
            items.insert(position, (parent, value))
            result = dict(items)
    return result


def clean_device_map(device_map: dict[str, Any], module_name: str = "") -> dict[str, Any]:
    """Merge the entries of ``device_map`` under ``module_name`` (all of them by default) into their
    parent's wherever every entry under that parent has the same device; ``device_map`` is changed
    in place and returned.

    Examples:
        >>> clean_device_map({"a.x": 0, "a.y": 0, "b.x": 1, "b.y": 1, "c": 1})
        {'a': 0, 'b': 1, 'c': 1}
    """
    prefix = f"{module_name}." if module_name else ""
    under = [k for k in device_map if not module_name or k == module_name or k.startswith(prefix)]
    relative = {("" if k == module_name else k[len(prefix) :]): device_map[k] for k in under}
    cleaned = _clean(relative)
    for key in under:
        del device_map[key]
    for key, value in cleaned.items():
        device_map[f"{prefix}{key}" if key else module_name] = value
    return device_map


def infer_auto_device_map(
    model: torch.nn.Module,
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: Iterable[str] | str | None = None,
    dtype: Any = None,
    special_dtypes: Mapping[str, Any] | None = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> dict[str, DeviceKey]:
    """Place the model's modules on GPUs in order, then on the CPU, then on disk, within ``max_memory``.

    Args:
        model: the model, usually a meta-device skeleton from ``init_empty_weights``.
        max_memory: budgets per device (see ``get_max_memory``); default: what is free here.
            Disk is used only if a ``"disk"`` budget is given.
        no_split_module_classes: class names of modules kept whole on one device (decoder
            blocks with residual connections); leaf modules are never split either.
        dtype: size floating-point weights as this dtype (the dtype they will be loaded in).
        special_dtypes: per-tensor dtype overriding ``dtype`` (e.g. weights kept in float32).
        verbose: print each placement decision.
        clean_result: merge entries into their parent module's when all share a device.
        offload_buffers: whether buffers of offloaded modules are offloaded too; if not (the
            default) they stay on the execution device, and a warning says when they do not fit.
        fallback_allocation: when the next module does not fit on a device that has nothing yet,
            put there the first later module that fits (with its tied modules) instead of leaving
            the device empty; modules then leave model order.

    Returns:
        ``{module name: device}`` covering every parameter and buffer, in model order.

    The first accelerator keeps room for the largest layer still to come when anything is
    offloaded (offloaded layers are brought there for their forward), and the CPU does when
    anything goes to disk; see the module docstring.

    Examples:
        >>> import torch
        >>> model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(3)])  # 257 KiB each
        >>> infer_auto_device_map(model, max_memory={0: "600KiB", "cpu": "1MiB"})  # 257 KiB kept free on 0
        {'0': 0, '1': 'cpu', '2': 'cpu'}

    Raises:
        ValueError: a module cannot be placed: larger than every budget, or all budgets full.
    """
    budgets = get_max_memory(max_memory)
    plan = unit_table(model, no_split_module_classes, dtype, special_dtypes)
    accelerators = [d for d in budgets if d not in ("cpu", "disk") and budgets[d] > 0]
    execution = accelerators[0] if accelerators else ("cpu" if "cpu" in budgets else None)
    reserve_on: set[DeviceKey] = set()
    while True:
        placed = _fill(plan, budgets, reserve_on, verbose, fallback_allocation)
        used = set(placed.values())
        needed: set[DeviceKey] = set()
        if execution is not None and execution != "cpu" and used & {"cpu", "disk"}:
            needed.add(execution)
        if "cpu" in budgets and execution != "mps" and "disk" in used:
            needed.add("cpu")
        if needed <= reserve_on:
            break
        reserve_on |= needed
        if verbose:
            print(f"modules are offloaded: planning again with room for one layer kept on {sorted(map(str, needed))}")
    device_map: dict[str, DeviceKey] = {plan.units[u].name: placed[u] for u in range(len(plan.units))}
    if not offload_buffers and accelerators:
        _warn_if_buffers_do_not_fit(plan, placed, budgets, accelerators)
    return _clean(device_map) if clean_result else device_map


def _warn_if_buffers_do_not_fit(
    plan: UnitTable, placed: dict[int, DeviceKey], budgets: dict[DeviceKey, int], accelerators: list[DeviceKey]
) -> None:
    buffer_ids: set[int] = set()
    used = dict.fromkeys(budgets, 0)
    for group in plan.groups:
        used[placed[group[0]]] += plan.group_size(plan.group_of[group[0]])
    for u, device in placed.items():
        if device in ("cpu", "disk"):
            buffer_ids |= {t for t in plan.units[u].tensors if not plan.infos[t].is_parameter}
    buffer_bytes = sum(plan.nbytes[t] for t in buffer_ids)
    if buffer_bytes and not any(budgets[d] - used[d] >= buffer_bytes for d in accelerators):
        warnings.warn(
            f"the buffers of offloaded modules ({format_size(buffer_bytes)}) stay on the GPU but fit in no GPU's "
            "remaining budget; pass offload_buffers=True if loading runs out of memory",
            stacklevel=3,
        )


def fits(plan: UnitTable, budgets: dict[DeviceKey, int]) -> bool:
    """Whether filling in order places every unit of ``plan`` within ``budgets``."""
    try:
        _fill(plan, budgets, set(), verbose=False)
    except ValueError:
        return False
    return True
