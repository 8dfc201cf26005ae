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

Layout, in layers (each folder imports only from the ones before it): ``core/`` (configs,
nested batches, unwrap, RNG state, memory, availability checks), ``io/`` (atomic writes, weight
files), ``process/`` (state, cluster environments, collectives), ``data/`` (sharded loaders,
samplers, ``Sharding``), ``precision/`` (autocast, fp8, dynamo), ``optim/`` (prepared optimizer and
scheduler), ``strategies/`` (behind the ``Strategy`` Protocol; ``select.decide`` picks one),
``checkpoint/`` (``save_state`` folders), ``tracking/`` (experiment trackers), ``accelerator/`` (the
facade, and ``PartialState``/``AcceleratorState`` as views over one accelerator's process state:
nothing shared between two), ``launchers/`` (``notebook_launcher``, ``debug_launcher``) and ``utils/`` (Accelerate's
``accelerate.utils`` names).
"""

from typing import Any

from x_runtime import utils
from x_runtime._version import __version__
from x_runtime.accelerator import Accelerator
from x_runtime.accelerator.state_views import AcceleratorState, GradientState, PartialState
from x_runtime.core.configs import (
    AORecipeKwargs,
    AutocastKwargs,
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    FP8RecipeKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProfileKwargs,
    ProjectConfiguration,
    TERecipeKwargs,
)
from x_runtime.core.memory import (
    clear_device_cache,
    find_executable_batch_size,
    free_memory,
    release_memory,
    should_reduce_batch_size,
)
from x_runtime.core.nested import find_batch_size, is_namedtuple, send_to_device
from x_runtime.core.parallel_handlers import (
    DeepSpeedSequenceParallelConfig,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
)
from x_runtime.core.parallelism import ParallelismConfig
from x_runtime.core.random_state import set_seed, synchronize_rng_states
from x_runtime.data.iterable_shard import IterableDatasetShard
from x_runtime.data.loader.loaders import DataLoaderDispatcher, DataLoaderShard
from x_runtime.data.loader.prepare import prepare_data_loader, skip_first_batches
from x_runtime.data.loader_state import DataLoaderStateMixin
from x_runtime.data.samplers import BatchSamplerShard, SeedableRandomSampler, SkipBatchSampler
from x_runtime.data.skip_loader import SkipDataLoader
from x_runtime.launchers.debug import debug_launcher
from x_runtime.launchers.notebook import notebook_launcher
from x_runtime.optim.local_sgd import LocalSGD
from x_runtime.precision.dynamo import TorchDynamoPlugin
from x_runtime.precision.policy import convert_to_fp32
from x_runtime.process.collectives import (
    broadcast,
    broadcast_object_list,
    copy_tensor_to_devices,
    gather,
    gather_object,
    pad_across_processes,
    reduce,
)
from x_runtime.process.collectives.debug import debug_mode, set_debug_mode, verify_operation
from x_runtime.process.collectives.errors import DistributedOperationException
from x_runtime.process.operations.logging import MultiProcessAdapter, get_logger
from x_runtime.process.topology.distributed_type import DistributedType
from x_runtime.provide import provide_accelerate
from x_runtime.strategies.deepspeed_plugin import DeepSpeedPlugin
from x_runtime.strategies.deepspeed_standins import (
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
    DummyOptim,
    DummyScheduler,
    HfDeepSpeedConfig,
)
from x_runtime.strategies.fsdp_merge import (
    load_fsdp_model,
    load_fsdp_optimizer,
    merge_fsdp_weights,
    save_fsdp_model,
    save_fsdp_optimizer,
)
from x_runtime.strategies.fsdp_plugin import FullyShardedDataParallelPlugin
from x_runtime.utils import *  # noqa: F403 - the is_*_available checks, named once in core.imports

__all__ = [
    "AORecipeKwargs",
    "Accelerator",
    "AcceleratorState",
    "AutocastKwargs",
    "BatchSamplerShard",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "DataLoaderStateMixin",
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedPlugin",
    "DeepSpeedSchedulerWrapper",
    "DeepSpeedSequenceParallelConfig",
    "DistributedDataParallelKwargs",
    "DistributedOperationException",
    "DistributedType",
    "DummyOptim",
    "DummyScheduler",
    "FP8RecipeKwargs",
    "FullyShardedDataParallelPlugin",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "GradientState",
    "HfDeepSpeedConfig",
    "InitProcessGroupKwargs",
    "IterableDatasetShard",
    "KwargsHandler",
    "LocalSGD",
    "MultiProcessAdapter",
    "ParallelismConfig",
    "PartialState",
    "ProfileKwargs",
    "ProjectConfiguration",
    "SeedableRandomSampler",
    "SkipBatchSampler",
    "SkipDataLoader",
    "TERecipeKwargs",
    "TorchContextParallelConfig",
    "TorchDynamoPlugin",
    "TorchTensorParallelConfig",
    "__version__",
    "broadcast",
    "broadcast_object_list",
    "clear_device_cache",
    "convert_to_fp32",
    "copy_tensor_to_devices",
    "debug_launcher",
    "debug_mode",
    "find_batch_size",
    "find_executable_batch_size",
    "free_memory",
    "gather",
    "gather_object",
    "get_logger",
    "is_namedtuple",
    "load_fsdp_model",
    "load_fsdp_optimizer",
    "merge_fsdp_weights",
    "notebook_launcher",
    "pad_across_processes",
    "prepare_data_loader",
    "provide_accelerate",
    "reduce",
    "release_memory",
    "save_fsdp_model",
    "save_fsdp_optimizer",
    "send_to_device",
    "set_debug_mode",
    "set_seed",
    "should_reduce_batch_size",
    "skip_first_batches",
    "synchronize_rng_states",
    "verify_operation",
]
__all__ += utils.__all__

# Accelerate's tracking names, loaded on first use as x_runtime.tracking loads them: importing
# x_runtime imports neither the tracker registry nor a backend's module.
_TRACKING = (
    "LOGGER_TYPE_TO_CLASS",
    "AimTracker",
    "ClearMLTracker",
    "CometMLTracker",
    "DVCLiveTracker",
    "GeneralTracker",
    "LoggerType",
    "MLflowTracker",
    "SwanLabTracker",
    "TensorBoardTracker",
    "TrackioTracker",
    "WandBTracker",
    "filter_trackers",
    "register_tracker_class",
)
__all__ += _TRACKING


def __getattr__(name: str) -> Any:
    if name in _TRACKING:
        from x_runtime import tracking

        return getattr(tracking, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
