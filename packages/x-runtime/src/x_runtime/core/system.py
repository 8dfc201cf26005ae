"""``check_os_kernel``: a warning when the Linux kernel is older than distributed training needs."""

from __future__ import annotations

import logging
import platform
import re

from torch.torch_version import TorchVersion

__all__ = ["MIN_KERNEL_VERSION", "check_os_kernel"]

_log = logging.getLogger(__name__)
# Older kernels can hang processes in collectives (Accelerate's issue #1929).
MIN_KERNEL_VERSION = "5.5.0"


def check_os_kernel() -> None:
    """Warn (a log record) when this is Linux with a kernel older than ``MIN_KERNEL_VERSION``.

    Other systems, and kernel releases without an ``x.y.z`` version, are not checked.
    """
    info = platform.uname()
    if info.system != "Linux":
        return
    found = re.search(r"\d+\.\d+\.\d+", info.release)
    if found is None:
        return
    version = found.group(0)
    if TorchVersion(version) < MIN_KERNEL_VERSION:
        # Formatted here: the record's msg itself names both versions.
        message = (
            f"Linux kernel {version} is older than {MIN_KERNEL_VERSION}, the minimum recommended: processes "
            f"can hang in collectives; upgrade the kernel to {MIN_KERNEL_VERSION} or later"
        )
        _log.warning(message)
