"""Memory budgets per device, in bytes, in the order devices are filled: ``get_max_memory``."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

import torch

from x_bigmodel.devices.device_keys import DeviceKey, check_devices_exist, device_key, in_filling_order
from x_common.devices import list_devices
from x_common.host_memory import host_memory
from x_common.sizes import parse_size

__all__ = [
    "CPU_MARGIN_BYTES",
    "CPU_MARGIN_FRACTION",
    "GPU_MARGIN_BYTES",
    "GPU_MARGIN_FRACTION",
    "UNLIMITED_DISK",
    "check_budget_devices",
    "get_max_memory",
    "with_disk",
]

# Logged under the public module's name, the one users know (and configured before this split).
logger = logging.getLogger("x_bigmodel.planning.device_map")

# Free GPU memory is not all usable for weights: the CUDA context of this process (often not
# created yet when NVML reports free memory) takes a few hundred MiB, and the allocator's
# fragmentation, activations and workspaces need headroom. Keep 512 MiB plus 5% of the card.
GPU_MARGIN_BYTES = 512 * 2**20
GPU_MARGIN_FRACTION = 0.05
# Leave the rest of the system (page cache for memory-mapped checkpoints, other processes) 1 GiB
# plus 5% of the RAM this process may use.
CPU_MARGIN_BYTES = 2**30
CPU_MARGIN_FRACTION = 0.05
# The "disk" budget an offload folder brings when max_memory gives none: no limit, as Accelerate's
# infer_auto_device_map always has disk last with no limit.
UNLIMITED_DISK = sys.maxsize


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
    machine. As in Accelerate, string sizes in a given dict are replaced by their bytes in place
    (transformers compares the caller's dict with the result), its keys left as written.

    Examples:
        >>> given = {1: "1GiB", "cpu": "2GiB", 0: 1024}
        >>> get_max_memory(given)
        {0: 1024, 1: 1073741824, 'cpu': 2147483648}
        >>> given
        {1: 1073741824, 'cpu': 2147483648, 0: 1024}

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
        return in_filling_order(budgets)
    budgets = {}
    for key, value in max_memory.items():
        device = device_key(key)
        if device in budgets:
            raise ValueError(f"device {device!r} is given twice in max_memory (as {key!r})")
        # A float is a byte count already scaled by the caller (transformers keeps 90% of the CPU's).
        if isinstance(value, float) and value >= 0:
            budgets[device] = int(value) if value != float("inf") else UNLIMITED_DISK
        else:
            budgets[device] = parse_size(value)
    if isinstance(max_memory, MutableMapping):
        for key, value in max_memory.items():
            if isinstance(value, str):
                max_memory[key] = parse_size(value)
    gpus = [k for k in budgets if isinstance(k, int)]
    if gpus:
        count = torch.cuda.device_count()
        missing = [k for k in gpus if k >= count]
        if missing:
            logger.warning("max_memory names GPU(s) %s, but this process sees %d CUDA device(s)", missing, count)
    return in_filling_order(budgets)


def with_disk(budgets: Mapping[DeviceKey, int]) -> dict[DeviceKey, int]:
    """``budgets`` with ``"disk"`` last, unlimited (``UNLIMITED_DISK``), unless a disk budget is given.

    What an offload folder means for planning: what does not fit in the other budgets goes to
    disk, as with Accelerate's ``load_checkpoint_and_dispatch``.

    Examples:
        >>> with_disk({0: 10, "cpu": 20}) == {0: 10, "cpu": 20, "disk": UNLIMITED_DISK}
        True
        >>> with_disk({"cpu": 20, "disk": 5})
        {'cpu': 20, 'disk': 5}
    """
    result = dict(budgets)
    result.setdefault("disk", UNLIMITED_DISK)
    return in_filling_order(result)


def check_budget_devices(max_memory: Mapping[Any, int | str] | None) -> None:
    """Refuse ``max_memory`` keys naming devices this process lacks, when loading here.

    ``get_max_memory`` keeps them (a map may be planned for another machine); a load cannot use them.

    Raises:
        ValueError: ``max_memory[7] is GPU 7, but ...; the devices here are ...``, or an invalid key.
    """
    if max_memory:
        check_devices_exist((f"max_memory[{key!r}]", device_key(key)) for key in max_memory)
