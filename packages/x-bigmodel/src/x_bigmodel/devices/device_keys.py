"""The values a device map or a memory budget names a device by, and the torch devices they mean.

A *device key* is an ``int`` for a CUDA (or current accelerator) device, or ``"mps"``, ``"cpu"``,
``"disk"``. Users may write ``"cuda:1"`` or ``torch.device("cuda", 1)``; ``device_key`` turns every
accepted spelling into the key, once, where a map or a budget enters the package.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from x_bigmodel.devices.tensor_placement import as_device
from x_common.env import CUDA_VISIBLE_DEVICES

__all__ = [
    "NAMED_DEVICES",
    "OFFLOAD_TARGETS",
    "DeviceKey",
    "check_devices_exist",
    "device_key",
    "in_filling_order",
    "present_devices",
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
                # "cuda" alone is the current device, as torch reads it (torch.cuda.set_device).
                return parsed.index if parsed.index is not None else _current_cuda_index()
            if parsed.type in ("mps", "cpu"):
                return parsed.type
    raise ValueError(
        f"invalid device {device!r}: expected a GPU index (0, 'cuda:1') or one of {', '.join(NAMED_DEVICES)}"
    )


def in_filling_order(budgets: Mapping[DeviceKey, int]) -> dict[DeviceKey, int]:
    """``budgets`` reordered as devices are filled: GPUs by index, then ``"mps"``, ``"cpu"``, ``"disk"``."""
    gpus = sorted(k for k in budgets if isinstance(k, int))
    order: list[DeviceKey] = [*gpus, *(n for n in NAMED_DEVICES if n in budgets)]
    return {k: budgets[k] for k in order}


def storage_device(key: DeviceKey) -> torch.device:
    """Where a tensor mapped to ``key`` is held when in memory: the CPU for ``"cpu"`` and ``"disk"``."""
    return torch.device("cpu") if key in OFFLOAD_TARGETS else as_device(key)


def run_device(key: DeviceKey, main: torch.device) -> torch.device:
    """Where a module mapped to ``key`` runs: ``main`` for offloaded (``"cpu"``/``"disk"``) entries."""
    return main if key in OFFLOAD_TARGETS else as_device(key)


def present_devices() -> tuple[DeviceKey, ...]:
    """The device keys usable in this process: accelerator indices, ``"mps"`` if available, ``"cpu"``, ``"disk"``."""
    accelerator = torch.accelerator.current_accelerator()
    count = torch.accelerator.device_count() if accelerator is not None and accelerator.type != "mps" else 0
    mps = ("mps",) if torch.backends.mps.is_available() else ()
    return (*range(count), *mps, "cpu", "disk")


def check_devices_exist(placed: Iterable[tuple[str, DeviceKey]]) -> None:
    """Refuse, in one line, the first device that does not exist here, naming those that do.

    Called before any weight moves, so that ``{"": 0}`` on a CPU-only torch is a clear error rather
    than torch's ``AssertionError: Torch not compiled with CUDA enabled`` halfway through a load.

    Args:
        placed: ``(where the user named it, device key)`` pairs, e.g. ``("device_map['lm_head']", 7)``.

    Raises:
        ValueError: ``device_map['lm_head'] is GPU 7, but this process sees 2 CUDA devices; the
            devices here are 0, 1, 'cpu', 'disk'``.
    """
    present = present_devices()
    for where, key in placed:
        if key in present:
            continue
        shown = ", ".join(repr(d) for d in present)
        raise ValueError(f"{where} is {_spelled(key)}, but {_why_absent(key)}; the devices here are {shown}")


def _spelled(key: DeviceKey) -> str:
    return f"GPU {key}" if isinstance(key, int) else repr(key)


def _why_absent(key: DeviceKey) -> str:
    if key == "mps":
        return "MPS is not available in this process (Apple silicon only)"
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None:
        build = f"torch {torch.__version__}"
        if torch.version.cuda is None:
            return f"{build} is built without CUDA (a CPU-only build)"
        return f"{build} sees no CUDA device (check the driver and {CUDA_VISIBLE_DEVICES.name})"
    count = torch.accelerator.device_count()
    return f"this process sees {count} {accelerator.type.upper()} device{'s' if count != 1 else ''}"


def _current_cuda_index() -> int:
    return torch.cuda.current_device() if torch.cuda.is_available() else 0
