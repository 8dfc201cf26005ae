"""x-common: the pieces every x package shares.

- ``x_common.env``: the launcher -> runtime environment-variable contract;
- ``x_common.sizes`` and ``x_common.dtypes``: sizes people write and bytes per dtype;
- ``x_common.module_sizes``: bytes per module, shared tensors counted once;
- ``x_common.devices`` and ``x_common.host_memory``: what hardware this process can use;
- ``x_common.process_env`` and ``x_common.slurm``: rank and rendezvous from torchrun or SLURM.

Importing it imports no torch.
"""

from x_common._version import __version__
from x_common.devices import BACKENDS, Device, available_backends, device_count, list_devices
from x_common.dtypes import dtype_bits, dtype_byte_size, dtype_name, is_floating, tensor_nbytes
from x_common.host_memory import HostMemory, host_memory
from x_common.module_sizes import module_sizes
from x_common.process_env import ProcessEnv, process_env
from x_common.sizes import format_size, parse_size

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
