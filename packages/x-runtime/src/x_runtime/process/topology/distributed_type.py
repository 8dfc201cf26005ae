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
    # Accelerate's names for hardware x does not drive; scripts compare against them.
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"
    MEGATRON_LM = "MEGATRON_LM"


# Sharding strategies need a process group even when the launcher started a single process.
SHARDED = (DistributedType.FSDP, DistributedType.DEEPSPEED)
