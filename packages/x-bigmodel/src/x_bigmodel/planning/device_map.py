"""Device maps, from what users write to a ``DevicePlan``: a dict or a strategy name, resolved once.

A *device map* maps module (or tensor) names to a device: an ``int`` for a CUDA device, or
``"mps"``, ``"cpu"``, ``"disk"``; ``""`` names the whole model. ``plan_device_map`` is the one
place a ``device_map`` argument is resolved: a strategy is planned (``infer_auto_device_map``
within budgets from ``get_max_memory``, balanced by ``get_balanced_memory``), a dict is checked
against the model; either way the result is a ``DevicePlan`` with normalised devices, which the
loader and the dispatcher read as is. ``resolve_device_map`` returns the same as a plain dict.

The planner and the budgets live in ``x_bigmodel.planning.auto_map``, ``x_bigmodel.planning.budgets`` and
``x_bigmodel.planning.balanced_memory``; their public functions are re-exported here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from x_bigmodel.devices.device_keys import DeviceKey, device_key
from x_bigmodel.planning.auto_map import infer_auto_device_map
from x_bigmodel.planning.balanced_memory import get_balanced_memory
from x_bigmodel.planning.budgets import get_max_memory, with_disk
from x_bigmodel.planning.device_plan import DeviceMap, DevicePlan, check_device_map

__all__ = [
    "DEVICE_MAP_STRATEGIES",
    "DeviceMap",
    "DevicePlan",
    "get_balanced_memory",
    "get_max_memory",
    "infer_auto_device_map",
    "plan_device_map",
    "resolve_device_map",
]

DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def plan_device_map(
    model: torch.nn.Module,
    device_map: DeviceMap | DevicePlan | str,
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: Iterable[str] | str | None = None,
    dtype: Any = None,
    special_dtypes: Mapping[str, Any] | None = None,
    offload_buffers: bool = False,
    verbose: bool = False,
    offload_folder: str | os.PathLike[str] | None = None,
) -> DevicePlan:
    """Resolve ``device_map`` once into a ``DevicePlan`` (see ``resolve_device_map`` for the forms).

    A ``DevicePlan`` is taken as already resolved: it is returned as is (with ``offload_folder``
    when one is given), not checked again. When a strategy is planned with an ``offload_folder``,
    disk is the last device, with no limit unless ``max_memory`` gives one: what does not fit in
    the other budgets goes to disk (as Accelerate's ``load_checkpoint_and_dispatch`` does).

    Examples:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        >>> plan = plan_device_map(model, {"0": "cuda:0", "1": "cpu"})
        >>> plan.device_for("0.weight"), plan.device_for("1.bias"), plan.accelerators
        (0, 'cpu', (0,))

    Raises:
        ValueError: as ``resolve_device_map``.
    """
    if isinstance(device_map, DevicePlan):
        return DevicePlan.from_map(device_map, offload_folder)
    if isinstance(device_map, str):
        if device_map not in DEVICE_MAP_STRATEGIES:
            raise ValueError(
                f"unknown device_map {device_map!r}: expected a dict or one of {', '.join(DEVICE_MAP_STRATEGIES)}"
            )
        budgets = get_max_memory(max_memory)
        if offload_folder is not None:
            budgets = with_disk(budgets)
        if device_map != "sequential":
            budgets = get_balanced_memory(
                model,
                budgets,
                no_split_module_classes,
                dtype,
                low_zero=device_map == "balanced_low_0",
                special_dtypes=special_dtypes,
            )
        planned = infer_auto_device_map(
            model,
            budgets,
            no_split_module_classes,
            dtype,
            special_dtypes,
            verbose=verbose,
            offload_buffers=offload_buffers,
        )
        return DevicePlan(entries=planned, offload_folder=offload_folder)
    if not isinstance(device_map, Mapping):
        raise ValueError(f"invalid device_map {device_map!r}: expected a dict or a strategy name")
    checked = check_device_map(model, device_map, offload_folder)
    if isinstance(checked, DevicePlan):
        return checked
    # check_device_map was replaced here (transformers swaps in a no-op for models whose map leaves some
    # parameters unplaced on purpose): the map is taken as given, its devices normalised.
    return DevicePlan(
        entries={name: device_key(value) for name, value in device_map.items()}, offload_folder=offload_folder
    )


def resolve_device_map(
    model: torch.nn.Module,
    device_map: DeviceMap | DevicePlan | str,
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: Iterable[str] | str | None = None,
    dtype: Any = None,
    special_dtypes: Mapping[str, Any] | None = None,
    offload_buffers: bool = False,
    verbose: bool = False,
) -> dict[str, DeviceKey]:
    """A checked device map from a dict or a strategy name.

    Strategies: ``"auto"`` and ``"balanced"`` spread the model evenly over the GPUs
    (``get_balanced_memory``), ``"balanced_low_0"`` does so keeping GPU 0 as empty as it can,
    ``"sequential"`` fills GPU 0, then GPU 1, and so on; all then use the CPU and, if
    ``max_memory`` gives a ``"disk"`` budget, the disk (``plan_device_map`` and the dispatch
    entries also do when given an offload folder).

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
    plan = plan_device_map(
        model,
        device_map,
        max_memory,
        no_split_module_classes,
        dtype,
        special_dtypes,
        offload_buffers=offload_buffers,
        verbose=verbose,
    )
    return plan.as_dict()
