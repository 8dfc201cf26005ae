"""The values a device map or a memory budget names a device by, and the torch devices they mean.

A *device key* is an ``int`` for a CUDA (or current accelerator) device, or ``"mps"``, ``"cpu"``,
``"disk"``. Users may write ``"cuda:1"`` or ``torch.device("cuda", 1)``; ``device_key`` turns every
accepted spelling into the key, once, where a map or a budget enters the package.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from x_bigmodel.tensor_placement import _as_device

__all__ = [
    "NAMED_DEVICES",
    "OFFLOAD_TARGETS",
    "DeviceKey",
    "device_key",
    "in_filling_order",
    "run_device",
    "storage_device",
]

DeviceKey = int | str

NAMED_DEVICES = ("mps", "cpu", "disk")
# Where weights wait between forwards when they do not live where their module runs.
OFFLOAD_TARGETS = ("cpu", "disk")


def device_key(device: Any) -> DeviceKey:
    """Canonical device-map value: ``int`` for CUDA devices, ``"mps"``, ``"cpu"`` or ``"disk"``.

    Examples:
        >>> device_key("cuda:1"), device_key(torch.device("cpu")), device_key("disk")
        (1, 'cpu', 'disk')

    Raises:
        ValueError: ``device`` names no such device.
    """
    if isinstance(device, bool):
        raise ValueError(f"invalid device {device!r}: expected a GPU index or one of {', '.join(NAMED_DEVICES)}")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"invalid device {device!r}: GPU indices are >= 0")
        return device
    if isinstance(device, str) and device in NAMED_DEVICES:
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
        f"invalid device {device!r}: expected a GPU index (0, 'cuda:1') or one of {', '.join(NAMED_DEVICES)}"
    )


def in_filling_order(budgets: Mapping[DeviceKey, int]) -> dict[DeviceKey, int]:
    """``budgets`` reordered as devices are filled: GPUs by index, then ``"mps"``, ``"cpu"``, ``"disk"``."""
    gpus = sorted(k for k in budgets if isinstance(k, int))
    return {k: budgets[k] for k in [*gpus, *(n for n in NAMED_DEVICES if n in budgets)]}


def storage_device(key: DeviceKey) -> torch.device:
    """Where a tensor mapped to ``key`` is held when in memory: the CPU for ``"cpu"`` and ``"disk"``."""
    return torch.device("cpu") if key in OFFLOAD_TARGETS else _as_device(key)


def run_device(key: DeviceKey, main: torch.device) -> torch.device:
    """Where a module mapped to ``key`` runs: ``main`` for offloaded (``"cpu"``/``"disk"``) entries."""
    return main if key in OFFLOAD_TARGETS else _as_device(key)
