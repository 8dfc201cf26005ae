"""``get_balanced_memory``: budgets that spread a model evenly over the GPUs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from x_bigmodel.devices.device_keys import DeviceKey
from x_bigmodel.planning.auto_map import fits
from x_bigmodel.planning.budgets import get_max_memory
from x_bigmodel.planning.model_units import unit_table

__all__ = ["get_balanced_memory"]


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
    plan = unit_table(model, no_split_module_classes, dtype, special_dtypes)
    sharing = gpus[1:] if low_zero else gpus
    full: dict[DeviceKey, int] = {d: budgets[d] for d in sharing}
    if not fits(plan, full):
        # The GPUs cannot hold the model even when full: nothing to balance, fill them all.
        if low_zero:
            budgets[gpus[0]] = min(max(0, sum(plan.nbytes) - sum(full.values())), budgets[gpus[0]])
        return budgets
    # The smallest per-GPU cap with which filling in order still places every module on the
    # GPUs: filling in order is optimal for a given cap, so this is the most even split.
    low, high = 0, max(full.values())
    while low < high:
        mid = (low + high) // 2
        if fits(plan, {d: min(mid, full[d]) for d in sharing}):
            high = mid
        else:
            low = mid + 1
    for device in sharing[:-1]:
        budgets[device] = min(low, budgets[device])
    if low_zero:
        budgets[gpus[0]] = 0
    return budgets
