"""x-runtime: the ``Accelerator`` that runs one training script on CPU, many GPUs, many machines.

    from x_runtime import Accelerator

    accelerator = Accelerator()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()

Names and semantics follow Accelerate's, so code written for it runs after changing imports.

Layout: ``accelerator`` (the facade) and ``configs`` here; ``process/`` (state, cluster
environments, collectives), ``data/`` (sharded loaders, samplers, ``Sharding``), ``precision/``
(autocast, fp8, dynamo), ``optim/`` (prepared optimizer and scheduler), ``strategies/`` (behind
the ``Strategy`` Protocol), ``checkpoint/`` (atomic checkpoints, weight files, RNG) and
``tracking/`` (experiment trackers); ``memory`` recovers from running out of memory.
"""

from x_runtime._version import __version__
from x_runtime.accelerator import Accelerator
from x_runtime.checkpoint.random_state import set_seed
from x_runtime.configs import (
    AORecipeKwargs,
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProjectConfiguration,
    TERecipeKwargs,
)
from x_runtime.data.data_loader import skip_first_batches
from x_runtime.data.nested import send_to_device
from x_runtime.memory import find_executable_batch_size, free_memory, release_memory
from x_runtime.precision.dynamo import TorchDynamoPlugin
from x_runtime.process.collectives import (
    broadcast,
    broadcast_object_list,
    gather,
    gather_object,
    pad_across_processes,
    reduce,
)
from x_runtime.process.distributed_type import DistributedType
from x_runtime.process.logging import get_logger
from x_runtime.strategies.deepspeed_plugin import DeepSpeedPlugin
from x_runtime.strategies.fsdp_plugin import FullyShardedDataParallelPlugin

__all__ = [
    "AORecipeKwargs",
    "Accelerator",
    "AutocastKwargs",
    "DataLoaderConfiguration",
    "DeepSpeedPlugin",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "FullyShardedDataParallelPlugin",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "ProjectConfiguration",
    "TERecipeKwargs",
    "TorchDynamoPlugin",
    "__version__",
    "broadcast",
    "broadcast_object_list",
    "find_executable_batch_size",
    "free_memory",
    "gather",
    "gather_object",
    "get_logger",
    "pad_across_processes",
    "reduce",
    "release_memory",
    "send_to_device",
    "set_seed",
    "skip_first_batches",
]
