"""Decide where each module of a model goes: GPUs first, then CPU RAM, then disk.

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
"""

from __future__ import annotations

import difflib
import heapq
import logging
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from x_common.devices import list_devices
from x_common.dtypes import tensor_nbytes
from x_common.host_memory import host_memory
from x_common.module_sizes import TensorInfo, tensor_infos
from x_common.sizes import format_size, parse_size

__all__ = [
    "DEVICE_MAP_STRATEGIES",
    "get_balanced_memory",
    "get_max_memory",
    "infer_auto_device_map",
    "resolve_device_map",
]

logger = logging.getLogger(__name__)

DeviceKey = int | str
DeviceMap = dict[str, DeviceKey]

DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")

# Free GPU memory is not all usable for weights: the CUDA context of this process (often not
# created yet when NVML reports free memory) takes a few hundred MiB, and the allocator's
# fragmentation, activations and workspaces need headroom. Keep 512 MiB plus 5% of the card.
GPU_MARGIN_BYTES = 512 * 2**20
GPU_MARGIN_FRACTION = 0.05
# Leave the rest of the system (page cache for memory-mapped checkpoints, other processes) 1 GiB
# plus 5% of the RAM this process may use.
CPU_MARGIN_BYTES = 2**30
CPU_MARGIN_FRACTION = 0.05

_NAMED_DEVICES = ("mps", "cpu", "disk")


def _device_key(device: Any) -> DeviceKey:
    """Canonical device-map value: ``int`` for CUDA devices, ``"mps"``, ``"cpu"`` or ``"disk"``."""
    if isinstance(device, bool):
        raise ValueError(f"invalid device {device!r}: expected a GPU index or one of {', '.join(_NAMED_DEVICES)}")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"invalid device {device!r}: GPU indices are >= 0")
        return device
    if isinstance(device, str) and device in _NAMED_DEVICES:
        return device
    if isinstance(device, (str, torch.device)):
        try:
            parsed = torch.device(device)
        except (RuntimeError, ValueError):
            parsed = None
        if parsed is not None:
            if parsed.type == "cuda":
                return parsed.index or 0
            if parsed.type in ("mps", "cpu"):
                return parsed.type
    raise ValueError(
        f"invalid device {device!r}: expected a GPU index (0, 'cuda:1') or one of {', '.join(_NAMED_DEVICES)}"
    )


def _ordered(budgets: Mapping[DeviceKey, int]) -> dict[DeviceKey, int]:
    gpus = sorted(k for k in budgets if isinstance(k, int))
    return {k: budgets[k] for k in [*gpus, *(n for n in _NAMED_DEVICES if n in budgets)]}


def get_max_memory(max_memory: Mapping[Any, int | str] | None = None) -> dict[DeviceKey, int]:
    """Memory budgets in bytes per device, in filling order: GPUs by index, ``"mps"``, ``"cpu"``, ``"disk"``.

    Without ``max_memory``: each visible CUDA device's free memory less ``GPU_MARGIN_BYTES`` and
    ``GPU_MARGIN_FRACTION`` of its total, and the available host RAM less ``CPU_MARGIN_BYTES``
    and ``CPU_MARGIN_FRACTION`` of the usable RAM (cgroup limits included). On Apple silicon the
    GPU shares host RAM, so that RAM is given as ``"mps"`` and no ``"cpu"`` budget is listed,
    as in Accelerate. No ``"disk"`` budget is given by default.

    With ``max_memory``: sizes may be ints or strings (``"10GiB"``, ``"500MB"``); keys may be
    GPU indices, ``"cuda:N"``, ``"mps"``, ``"cpu"``, ``"disk"``. GPU indices that do not exist
    here are kept with a logged warning, as Accelerate does, so maps can be planned for another
    machine. The given mapping is not modified.

    Examples:
        >>> get_max_memory({1: "1GiB", "cpu": "2GiB", 0: 1024})
        {0: 1024, 1: 1073741824, 'cpu': 2147483648}

    Raises:
        ValueError: a key is not a device or a value not a size.
    """
    if max_memory is None:
        budgets: dict[DeviceKey, int] = {}
        for dev in list_devices("cuda"):
            if dev.free_memory is None:
                continue
            margin = GPU_MARGIN_BYTES + int(GPU_MARGIN_FRACTION * (dev.total_memory or 0))
            budgets[dev.index] = max(0, dev.free_memory - margin)
        mem = host_memory()
        available = mem.available if mem.available is not None else mem.total
        host = max(0, available - CPU_MARGIN_BYTES - int(CPU_MARGIN_FRACTION * mem.total))
        if torch.backends.mps.is_available():
            budgets["mps"] = host
        else:
            budgets["cpu"] = host
        return _ordered(budgets)
    budgets = {}
    for key, value in max_memory.items():
        device = _device_key(key)
        if device in budgets:
            raise ValueError(f"device {device!r} is given twice in max_memory (as {key!r})")
        budgets[device] = parse_size(value)
    gpus = [k for k in budgets if isinstance(k, int)]
    if gpus:
        count = torch.cuda.device_count()
        missing = [k for k in gpus if k >= count]
        if missing:
            logger.warning("max_memory names GPU(s) %s, but this process sees %d CUDA device(s)", missing, count)
    return _ordered(budgets)


@dataclass
class _Unit:
    name: str
    module: torch.nn.Module | None  # None for a tensor placed on its own
    tensors: set[int] = field(default_factory=set)  # indices into the tensor list


def _no_split_set(no_split_module_classes: Iterable[str] | str | None) -> set[str]:
    if no_split_module_classes is None:
        return set()
    if isinstance(no_split_module_classes, str):
        return {no_split_module_classes}
    return set(no_split_module_classes)


def _units(model: torch.nn.Module, no_split: set[str]) -> list[_Unit]:
    """The model cut into pieces that are never split, in model order."""

    def atomic(module: torch.nn.Module) -> bool:
        return type(module).__name__ in no_split or not any(True for _ in module.children())

    if atomic(model):
        return [_Unit("", model)]
    units: list[_Unit] = []

    def walk(module: torch.nn.Module, prefix: str) -> None:
        # Order as Accelerate: a module's own parameters, then its children, then its own buffers.
        units.extend(_Unit(prefix + n, None) for n, _ in module.named_parameters(recurse=False))
        for name, child in module.named_children():
            if atomic(child):
                units.append(_Unit(prefix + name, child))
            else:
                walk(child, f"{prefix}{name}.")
        units.extend(_Unit(prefix + n, None) for n, _ in module.named_buffers(recurse=False))

    walk(model, "")
    return units


def _tensor_bytes(info: TensorInfo, dtype: Any, special_dtypes: Mapping[str, Any] | None) -> int:
    if special_dtypes:
        for name in info.names:
            if name in special_dtypes:
                return tensor_nbytes(info.numel, special_dtypes[name])
    return info.nbytes(dtype)


@dataclass
class _Plan:
    units: list[_Unit]
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


def _plan(
    model: torch.nn.Module,
    no_split_module_classes: Iterable[str] | str | None,
    dtype: Any,
    special_dtypes: Mapping[str, Any] | None,
) -> _Plan:
    units = _units(model, _no_split_set(no_split_module_classes))
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
    nbytes = [_tensor_bytes(info, dtype, special_dtypes) for info in infos]
    return _Plan(units, infos, nbytes, group_list, group_of)


def _fill(
    plan: _Plan,
    budgets: dict[DeviceKey, int],
    reserve_on: set[DeviceKey],
    verbose: bool,
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


def _no_room_message(plan: _Plan, members: list[int], size: int, budgets: dict[DeviceKey, int]) -> str:
    names = " + ".join(repr(plan.units[m].name) for m in members)
    largest_device = max(budgets, key=lambda d: budgets[d]) if budgets else None
    largest = budgets[largest_device] if budgets else 0
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
        message += "; give a 'disk' budget in max_memory to offload the rest to disk"
    return message


def _clean(device_map: DeviceMap) -> DeviceMap:
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


def infer_auto_device_map(
    model: torch.nn.Module,
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: Iterable[str] | str | None = None,
    dtype: Any = None,
    special_dtypes: Mapping[str, Any] | None = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
) -> DeviceMap:
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
    plan = _plan(model, no_split_module_classes, dtype, special_dtypes)
    accelerators = [d for d in budgets if d not in ("cpu", "disk") and budgets[d] > 0]
    execution = accelerators[0] if accelerators else ("cpu" if "cpu" in budgets else None)
    reserve_on: set[DeviceKey] = set()
    while True:
        placed = _fill(plan, budgets, reserve_on, verbose)
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
    device_map: DeviceMap = {plan.units[u].name: placed[u] for u in range(len(plan.units))}
    if not offload_buffers and accelerators:
        _warn_if_buffers_do_not_fit(plan, placed, budgets, accelerators)
    return _clean(device_map) if clean_result else device_map


def _warn_if_buffers_do_not_fit(
    plan: _Plan, placed: dict[int, DeviceKey], budgets: dict[DeviceKey, int], accelerators: list[DeviceKey]
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


def _fits(plan: _Plan, budgets: dict[DeviceKey, int]) -> bool:
    try:
        _fill(plan, budgets, set(), verbose=False)
    except ValueError:
        return False
    return True


def get_balanced_memory(
    model: torch.nn.Module,
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: Iterable[str] | str | None = None,
    dtype: Any = None,
    low_zero: bool = False,
    special_dtypes: Mapping[str, Any] | None = None,
) -> dict[DeviceKey, int]:
    """Budgets that make ``infer_auto_device_map`` spread the model evenly over the GPUs.

    Every GPU but the last is capped at the smallest size with which the model, filled in
    order, still fits on the GPUs: the most even split that keeps layers whole (Accelerate
    instead caps at ``size / GPUs`` plus a margin, which can leave the last GPU nearly empty).
    The last GPU, CPU and disk keep their budgets. If the GPUs cannot hold the model, the
    budgets are returned unchanged. With ``low_zero`` GPU 0 is left empty when the other GPUs
    can hold the model, free for generation's work (``device_map="balanced_low_0"``), and gets
    only what they cannot hold otherwise.

    Examples:
        >>> import torch
        >>> model = torch.nn.Sequential(*[torch.nn.Linear(128, 128, bias=False) for _ in range(4)])
        >>> get_balanced_memory(model, {0: "1MiB", 1: "1MiB", "cpu": "1MiB"})
        {0: 131072, 1: 1048576, 'cpu': 1048576}
    """
    budgets = get_max_memory(max_memory)
    gpus = [d for d in budgets if isinstance(d, int) and budgets[d] > 0]
    if not gpus:
        return budgets
    if len(gpus) == 1:
        return budgets
    plan = _plan(model, no_split_module_classes, dtype, special_dtypes)
    sharing = gpus[1:] if low_zero else gpus
    full = {d: budgets[d] for d in sharing}
    if not _fits(plan, full):
        # The GPUs cannot hold the model even when full: nothing to balance, fill them all.
        if low_zero:
            budgets[gpus[0]] = min(max(0, sum(plan.nbytes) - sum(full.values())), budgets[gpus[0]])
        return budgets
    # The smallest per-GPU cap with which filling in order still places every module on the
    # GPUs: filling in order is optimal for a given cap, so this is the most even split.
    low, high = 0, max(full.values())
    while low < high:
        mid = (low + high) // 2
        if _fits(plan, {d: min(mid, full[d]) for d in sharing}):
            high = mid
        else:
            low = mid + 1
    for device in sharing[:-1]:
        budgets[device] = min(low, budgets[device])
    if low_zero:
        budgets[gpus[0]] = 0
    return budgets


def resolve_device_map(
    model: torch.nn.Module,
    device_map: Mapping[str, Any] | str,
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: Iterable[str] | str | None = None,
    dtype: Any = None,
    special_dtypes: Mapping[str, Any] | None = None,
    offload_buffers: bool = False,
    verbose: bool = False,
) -> DeviceMap:
    """A checked device map from a dict or a strategy name.

    Strategies: ``"auto"`` and ``"balanced"`` spread the model evenly over the GPUs
    (``get_balanced_memory``), ``"balanced_low_0"`` does so keeping GPU 0 as empty as it can,
    ``"sequential"`` fills GPU 0, then GPU 1, and so on; all then use the CPU and, if
    ``max_memory`` gives a ``"disk"`` budget, the disk.

    A dict is validated: every key must name a module or tensor of ``model`` (``""`` is the
    whole model), every parameter and buffer must be covered by a key, tensors shared between
    modules must land on one device, and values are normalised (``"cuda:1"`` becomes ``1``).

    Examples:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        >>> resolve_device_map(model, {"0": "cuda:0", "1": "cpu"})
        {'0': 0, '1': 'cpu'}
        >>> resolve_device_map(model, "sequential", max_memory={0: "1KiB", "cpu": "1MiB"})
        {'': 0}

    Raises:
        ValueError: unknown strategy, unknown module name (the nearest valid name is suggested),
            uncovered tensors, tied tensors on different devices, or a model that does not fit.
    """
    if isinstance(device_map, str):
        if device_map not in DEVICE_MAP_STRATEGIES:
            raise ValueError(
                f"unknown device_map {device_map!r}: expected a dict or one of {', '.join(DEVICE_MAP_STRATEGIES)}"
            )
        budgets = get_max_memory(max_memory)
        if device_map != "sequential":
            budgets = get_balanced_memory(
                model,
                budgets,
                no_split_module_classes,
                dtype,
                low_zero=device_map == "balanced_low_0",
                special_dtypes=special_dtypes,
            )
        return infer_auto_device_map(
            model,
            budgets,
            no_split_module_classes,
            dtype,
            special_dtypes,
            verbose=verbose,
            offload_buffers=offload_buffers,
        )
    if not isinstance(device_map, Mapping):
        raise ValueError(f"invalid device_map {device_map!r}: expected a dict or a strategy name")
    return _check_device_map(model, device_map)


def _check_device_map(model: torch.nn.Module, device_map: Mapping[str, Any]) -> DeviceMap:
    infos = tensor_infos(model)
    valid = {name for name, _ in model.named_modules(remove_duplicate=False)}
    valid.update(name for info in infos for name in info.names)
    result: DeviceMap = {}
    for key, value in device_map.items():
        if not isinstance(key, str) or key not in valid:
            near = difflib.get_close_matches(str(key), sorted(valid - {""}), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ValueError(f"device_map names {key!r}, which is not a module or tensor of the model{hint}")
        try:
            result[key] = _device_key(value)
        except ValueError as exc:
            raise ValueError(f"device_map[{key!r}]: {exc}") from None

    def device_of(name: str) -> DeviceKey | None:
        # The most specific entry wins, so a map may override one child of a mapped parent.
        parts = name.split(".")
        for cut in range(len(parts), -1, -1):
            prefix = ".".join(parts[:cut])
            if prefix in result:
                return result[prefix]
        return None

    uncovered: list[str] = []
    for info in infos:
        devices = {name: device_of(name) for name in info.names}
        uncovered.extend(name for name, device in devices.items() if device is None)
        placed = {d for d in devices.values() if d is not None}
        if len(placed) > 1:
            raise ValueError(
                f"tensor shared as {', '.join(info.names)} is mapped to different devices "
                f"({', '.join(f'{n}: {d!r}' for n, d in devices.items())}); a shared tensor lives on one device"
            )
    if uncovered:
        shown = ", ".join(uncovered[:10]) + (f" and {len(uncovered) - 10} more" if len(uncovered) > 10 else "")
        raise ValueError(f"device_map does not place {shown}; add them (or a parent module) to the map")
    return result
