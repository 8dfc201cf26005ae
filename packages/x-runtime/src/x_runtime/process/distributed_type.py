"""``DistributedType``: the names of the strategies, as Accelerate spells them.

Its own module because both the process state and the environments that place a process need
the names, and neither may import the other's module.
"""

from __future__ import annotations

__all__ = ["SHARDED", "DistributedType"]


class DistributedType:
    """Names of the strategies, as Accelerate spells them."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_XPU = "MULTI_XPU"
    FSDP = "FSDP"
    DEEPSPEED = "DEEPSPEED"
    XLA = "XLA"


# Sharding strategies need a process group even when the launcher started a single process.
SHARDED = (DistributedType.FSDP, DistributedType.DEEPSPEED)
