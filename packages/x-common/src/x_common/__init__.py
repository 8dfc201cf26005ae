"""x-common: the pieces every x package shares.

- ``x_common.env``: the launcher -> runtime environment-variable contract;
- ``x_common.kinds``: value kinds (bool, int, choice, ...) that parse and check settings, one
  implementation for the environment, the launch config file and the command line;
- ``x_common.fsdp_reshard``: Accelerate's ``fsdp_reshard_after_forward`` (a bool, or an FSDP1
  strategy name), split and translated once for the launcher and the runtime;
- ``x_common.sizes`` and ``x_common.dtypes``: sizes people write and bytes per dtype;
- ``x_common.module_sizes``: bytes per module, shared tensors counted once;
- ``x_common.devices`` and ``x_common.host_memory``: what hardware this process can use;
- ``x_common.process_env`` and ``x_common.slurm``: rank and rendezvous from torchrun or SLURM.

Importing it imports no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from x_common._version import __version__

# These three share their module's name: bound here, after their modules are imported, so the
# package attribute is the function whichever import comes first.
from x_common.host_memory import HostMemory, host_memory
from x_common.module_sizes import module_sizes
from x_common.process_env import ProcessEnv, process_env

# The rest is imported on first use: ``import x_common`` (done by every x command at start-up)
# stays cheap; device discovery and size parsing load only when asked for.
_HOME = {
    "BACKENDS": "devices",
    "Device": "devices",
    "available_backends": "devices",
    "device_count": "devices",
    "list_devices": "devices",
    "dtype_bits": "dtypes",
    "dtype_byte_size": "dtypes",
    "dtype_name": "dtypes",
    "is_floating": "dtypes",
    "tensor_nbytes": "dtypes",
    "format_size": "sizes",
    "parse_size": "sizes",
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'x_common' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"x_common.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])


__all__ = [
    "BACKENDS",
    "Device",
    "HostMemory",
    "ProcessEnv",
    "__version__",
    "available_backends",
    "device_count",
    "dtype_bits",
    "dtype_byte_size",
    "dtype_name",
    "format_size",
    "host_memory",
    "is_floating",
    "list_devices",
    "module_sizes",
    "parse_size",
    "process_env",
    "tensor_nbytes",
]
