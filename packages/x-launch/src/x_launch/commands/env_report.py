"""``x-launch env``: what a bug report needs, in one paste."""

from __future__ import annotations

import importlib.metadata
import platform
import sys
from pathlib import Path

from x_common.sizes import format_size

__all__ = ["env_report"]

_DISTRIBUTIONS = (
    "x-common",
    "x-launch",
    "x-runtime",
    "x-bigmodel",
    "x-estimate",
    "torch",
    "accelerate",
    "deepspeed",
    "torch_xla",
)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def env_report(config_path: Path | None, config_source: str) -> str:
    """Versions, platform, devices with memory, host RAM, and the config file with its contents."""
    from x_common.devices import list_devices
    from x_common.host_memory import host_memory

    lines = ["x-launch environment", "", f"- Python: {sys.version.split()[0]} ({sys.executable})"]
    lines += [f"- {dist}: {_version(dist)}" for dist in _DISTRIBUTIONS]
    try:
        import torch  # list_devices below imports it anyway; its own version names the build (+cpu, +cu130)

        lines.append(f"- torch build: {torch.__version__}, CUDA {torch.version.cuda or 'none'}")
    except ImportError:
        pass
    lines.append(f"- Platform: {platform.platform()}")
    mem = host_memory()
    limit = f" (cgroup limit {format_size(mem.cgroup_limit)})" if mem.cgroup_limit else ""
    available = "unknown" if mem.available is None else format_size(mem.available)
    lines.append(f"- Host RAM: {format_size(mem.total)} usable, {available} available{limit}")
    for device in list_devices():
        total = "unknown" if device.total_memory is None else format_size(device.total_memory)
        free = "unknown" if device.free_memory is None else format_size(device.free_memory)
        lines.append(f"- Device {device.torch_device}: {device.name}, {free} free of {total}")
    if config_path is None:
        lines.append("- Config file: none (x-launch config default writes one)")
    else:
        lines.append(f"- Config file: {config_path} ({config_source})")
        try:
            contents = config_path.read_text().rstrip()
        except OSError as exc:
            contents = f"(cannot read: {exc.strerror or exc})"
        lines += ["", "```yaml", contents, "```"]
    return "\n".join(lines)
