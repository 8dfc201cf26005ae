"""Which accelerators this process can use, how many, and how much memory each has.

Nothing heavy is imported by importing this module: torch is imported when a function is
called, and only if it is installed (``x-common`` does not depend on it; without torch, only
the CPU is reported). Counting devices never initialises an accelerator runtime. Asking for
CUDA device details initialises CUDA in this process (device properties) but creates no
CUDA context when NVML is present; XLA devices are counted from the device files and
``PJRT_DEVICE`` without starting the XLA runtime, which would claim the TPU chips.
"""

from __future__ import annotations

import glob
import importlib.util
import platform
from dataclasses import dataclass
from types import ModuleType

from x_common import env
from x_common.host_memory import host_memory
from x_common.nvml import nvml_compute_capabilities, nvml_memory

# nvml_compute_capabilities: (major, minor) of every NVIDIA GPU, without torch; x-launch refuses
# bf16 on GPUs that predate it before starting anything.
__all__ = ["BACKENDS", "Device", "available_backends", "device_count", "list_devices", "nvml_compute_capabilities"]

BACKENDS = ("cuda", "xpu", "mps", "xla", "cpu")


@dataclass(frozen=True)
class Device:
    """One device; memory in bytes, ``None`` where the backend cannot tell without side effects."""

    backend: str
    index: int
    name: str
    total_memory: int | None
    free_memory: int | None

    @property
    def torch_device(self) -> str:
        """The string ``torch.device`` takes, e.g. ``"cuda:1"``."""
        return f"{self.backend}:{self.index}"


def _torch() -> ModuleType | None:
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    return torch


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")


def device_count(backend: str) -> int:
    """Devices of ``backend`` visible to this process (1 for ``"cpu"``).

    Examples:
        >>> device_count("cpu")
        1
    """
    _check_backend(backend)
    if backend == "cpu":
        return 1
    if backend == "xla":
        return _xla_count()
    torch = _torch()
    if torch is None:
        return 0
    if backend == "cuda":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "xpu":
        xpu = getattr(torch, "xpu", None)
        return xpu.device_count() if xpu is not None and xpu.is_available() else 0
    mps = getattr(torch.backends, "mps", None)
    return 1 if mps is not None and mps.is_available() else 0


def available_backends() -> tuple[str, ...]:
    """Backends with at least one device, in order of preference; ``"cpu"`` is always last.

    Examples:
        >>> available_backends()[-1]
        'cpu'
    """
    return tuple(backend for backend in BACKENDS if device_count(backend) > 0)


def list_devices(backend: str | None = None) -> list[Device]:
    """Every device of ``backend`` (all backends when ``None``) with its memory.

    The CPU "device" reports host RAM as this process can use it (see ``host_memory``).

    Examples:
        >>> [d.torch_device for d in list_devices("cpu")]
        ['cpu:0']
    """
    if backend is None:
        return [device for name in available_backends() for device in list_devices(name)]
    _check_backend(backend)
    count = device_count(backend)
    if count == 0:
        return []
    if backend == "cpu":
        mem = host_memory()
        return [Device("cpu", 0, _cpu_name(), mem.total, mem.available)]
    if backend == "xla":
        return [Device("xla", i, f"XLA ({env.PJRT_DEVICE.read() or 'TPU'})", None, None) for i in range(count)]
    if backend == "cuda":
        return _cuda_devices(count)
    if backend == "xpu":
        return _xpu_devices(count)
    return [_mps_device()]


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cuda_devices(count: int) -> list[Device]:
    torch = _torch()
    assert torch is not None
    props = [torch.cuda.get_device_properties(i) for i in range(count)]
    bus_ids = [_pci_bus_id(p) for p in props]
    by_bus = nvml_memory([b for b in bus_ids if b is not None])
    devices = []
    for index, (prop, bus_id) in enumerate(zip(props, bus_ids, strict=False)):
        total = int(prop.total_memory)
        nvml = by_bus.get(bus_id) if bus_id is not None else None
        # A MIG slice or an odd driver can make NVML's whole-GPU figure disagree with what
        # CUDA gives this process; then ask CUDA itself (this creates a context).
        if nvml is not None and abs(nvml[1] - total) <= 0.05 * total:
            free = min(nvml[0], total)
        else:
            free, total = (int(v) for v in torch.cuda.mem_get_info(index))
        devices.append(Device("cuda", index, prop.name, total, free))
    return devices


def _pci_bus_id(prop: object) -> str | None:
    domain, bus, device = (getattr(prop, f"pci_{part}_id", None) for part in ("domain", "bus", "device"))
    if domain is None or bus is None or device is None:
        return None
    return f"{domain:08x}:{bus:02x}:{device:02x}.0"


def _xpu_devices(count: int) -> list[Device]:
    torch = _torch()
    assert torch is not None
    devices = []
    for index in range(count):
        prop = torch.xpu.get_device_properties(index)
        total, free = int(prop.total_memory), None
        mem_get_info = getattr(torch.xpu, "mem_get_info", None)
        if mem_get_info is not None:
            free, total = (int(v) for v in mem_get_info(index))
        devices.append(Device("xpu", index, prop.name, total, free))
    return devices


def _mps_device() -> Device:
    torch = _torch()
    assert torch is not None
    total = free = None
    recommended = getattr(torch.mps, "recommended_max_memory", None)
    if recommended is not None:
        total = int(recommended())
        free = max(0, total - int(torch.mps.driver_allocated_memory()))
    return Device("mps", 0, "Apple MPS", total, free)


def _xla_count() -> int:
    if importlib.util.find_spec("torch_xla") is None:
        return 0
    pjrt = env.PJRT_DEVICE.read()
    if pjrt == "CPU":
        return env.CPU_NUM_DEVICES.read() or 1
    chips = glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*")
    return len(chips)
