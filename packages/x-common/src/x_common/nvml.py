"""Free and total memory and compute capability of NVIDIA GPUs through NVML.

NVML answers without creating a CUDA context, which ``torch.cuda.mem_get_info`` would do
(hundreds of MiB on each device, in the asking process). Devices are matched by PCI bus id
because NVML's index order need not be CUDA's (``CUDA_DEVICE_ORDER``, ``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

import ctypes

__all__ = ["nvml_compute_capabilities", "nvml_memory"]


class _MemoryInfo(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def nvml_memory(pci_bus_ids: list[str]) -> dict[str, tuple[int, int]]:
    """``{bus_id: (free, total)}`` for the ids NVML knows; empty when NVML is unavailable."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return {}
    if lib.nvmlInit_v2() != 0:
        return {}
    found: dict[str, tuple[int, int]] = {}
    try:
        for bus_id in pci_bus_ids:
            handle = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByPciBusId_v2(bus_id.encode(), ctypes.byref(handle)) != 0:
                continue
            info = _MemoryInfo()
            if lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(info)) == 0:
                found[bus_id] = (int(info.free), int(info.total))
    finally:
        lib.nvmlShutdown()
    return found


def nvml_compute_capabilities() -> list[tuple[int, int]]:
    """``(major, minor)`` of every GPU NVML sees, in NVML's order; empty when NVML is unavailable.

    Read without torch, so a launcher can refuse e.g. bf16 on pre-Ampere GPUs before starting.
    """
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return []
    if lib.nvmlInit_v2() != 0:
        return []
    found: list[tuple[int, int]] = []
    try:
        count = ctypes.c_uint()
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            major, minor = ctypes.c_int(), ctypes.c_int()
            if lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
                continue
            if lib.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)) == 0:
                found.append((major.value, minor.value))
    finally:
        lib.nvmlShutdown()
    return found
