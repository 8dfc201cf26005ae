"""Host RAM as this process can really use it.

Inside a container or a SLURM job the cgroup limit, not the machine's RAM, decides when the
kernel kills the process, so the total and available figures are capped by the tightest
memory limit on this process's cgroup path (cgroup v2 or v1).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HostMemory", "host_memory"]

_NO_LIMIT_V1 = 1 << 60  # cgroup v1 writes a huge page-aligned number for "no limit"


@dataclass(frozen=True)
class HostMemory:
    """Bytes of host RAM: ``total`` usable by this process, ``available`` now (None if unknown).

    ``machine_total`` is the physical RAM; ``cgroup_limit`` the memory limit that caps
    ``total``, when there is one.
    """

    total: int
    available: int | None
    machine_total: int
    cgroup_limit: int | None = None


def host_memory(
    *, proc: str | os.PathLike[str] = "/proc", cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup"
) -> HostMemory:
    """RAM of this host as seen by this process.

    Examples:
        >>> mem = host_memory()
        >>> mem.total <= mem.machine_total
        True
    """
    meminfo = _read_meminfo(Path(proc) / "meminfo")
    if meminfo is not None:
        machine_total, available = meminfo
    elif sys.platform == "win32":  # pragma: no cover - exercised on Windows runners only
        machine_total, available = _windows_memory()
    else:  # pragma: no cover - macOS and BSDs
        machine_total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        available = None
    limit = _cgroup_limit(Path(proc), Path(cgroup_root))
    if limit is None:
        return HostMemory(total=machine_total, available=available, machine_total=machine_total)
    cap, free_under_cap = limit
    total = min(machine_total, cap)
    if available is None:
        available = free_under_cap
    elif free_under_cap is not None:
        available = min(available, free_under_cap)
    if available is not None:
        available = min(available, total)
    return HostMemory(total=total, available=available, machine_total=machine_total, cgroup_limit=cap)


def _read_meminfo(path: Path) -> tuple[int, int | None] | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    fields: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    if "MemTotal" not in fields:
        return None
    return fields["MemTotal"], fields.get("MemAvailable")


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _inactive_file(stat_path: Path) -> int:
    try:
        for line in stat_path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key in ("inactive_file", "total_inactive_file") and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0


def _cgroup_limit(proc: Path, cgroup_root: Path) -> tuple[int, int | None] | None:
    """(tightest limit on our cgroup path, least room left under any limit on that path).

    The two can come from different levels: a SLURM step and its job often have the same
    limit, while the job's other steps use up the job's share.
    """
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    tightest: int | None = None
    room: int | None = None
    for line in lines:
        hierarchy, controllers, path = ([*line.split(":", 2), "", ""])[:3]
        if hierarchy == "0" and controllers == "":
            base, limit_file, usage_file, stat_file = cgroup_root, "memory.max", "memory.current", "memory.stat"
        elif "memory" in controllers.split(","):
            base = cgroup_root / "memory"
            limit_file, usage_file, stat_file = "memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat"
        else:
            continue
        # A limit may sit on any ancestor; walk from our cgroup up to the root.
        directory = base / path.lstrip("/")
        while True:
            limit = _read_int(directory / limit_file)
            if limit is not None and limit < _NO_LIMIT_V1:
                usage = _read_int(directory / usage_file)
                free = None if usage is None else max(0, limit - usage + _inactive_file(directory / stat_file))
                free = None if free is None else min(free, limit)
                tightest = limit if tightest is None else min(tightest, limit)
                if free is not None:
                    room = free if room is None else min(room, free)
            if directory == base or base not in directory.parents:
                break
            directory = directory.parent
    return None if tightest is None else (tightest, room)


def _windows_memory() -> tuple[int, int]:  # pragma: no cover - Windows only
    import ctypes

    class _Status(ctypes.Structure):
        _fields_ = [
            ("dwLength", ctypes.c_ulong),
            ("dwMemoryLoad", ctypes.c_ulong),
            ("ullTotalPhys", ctypes.c_ulonglong),
            ("ullAvailPhys", ctypes.c_ulonglong),
            ("ullTotalPageFile", ctypes.c_ulonglong),
            ("ullAvailPageFile", ctypes.c_ulonglong),
            ("ullTotalVirtual", ctypes.c_ulonglong),
            ("ullAvailVirtual", ctypes.c_ulonglong),
            ("ullAvailExtendedVirtual", ctypes.c_ulonglong),
        ]

    status = _Status()
    status.dwLength = ctypes.sizeof(_Status)
    ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status))  # type: ignore[attr-defined]
    return int(status.ullTotalPhys), int(status.ullAvailPhys)
