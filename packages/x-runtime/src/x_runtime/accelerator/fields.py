"""The fields of an ``Accelerator`` that its parts share, declared once.

Each part of the facade (``prepare``, ``step``, ``processes``, ``checkpoints``, ``tracking``,
``ddp``, ``profile``, ``preemption``) is a mixin over ``AcceleratorFields``: it reads these
fields and nothing else of the others, so a type checker sees every field a part uses and the
one place it is declared. ``Accelerator.__init__`` sets them all.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from x_runtime.accelerator.prepared import PreparedObjects
    from x_runtime.accelerator.state_views import AcceleratorState
    from x_runtime.core.configs import DataLoaderConfiguration, Handlers, ProjectConfiguration
    from x_runtime.core.parallelism import ParallelismConfig
    from x_runtime.data.gradient_state import GradientState
    from x_runtime.memory.guard import GuardOptions, MemoryGuard
    from x_runtime.precision.dynamo import TorchDynamoPlugin
    from x_runtime.precision.policy import Precision
    from x_runtime.process.topology.state import ProcessState
    from x_runtime.strategies.base import Strategy
    from x_runtime.strategies.layout import Layout
    from x_runtime.tracking.base import GeneralTracker

__all__ = ["AcceleratorFields"]


class AcceleratorFields:
    """What one accelerator holds; every part of the facade reads it through ``self``."""

    process_state: ProcessState  # rank, world, device, process group: the one the strategy was built on
    state: AcceleratorState  # Accelerate's view over ``process_state``
    gradient_state: GradientState
    precision: Precision
    strategy: Strategy
    handlers: Handlers
    dataloader_config: DataLoaderConfiguration
    project_configuration: ProjectConfiguration
    dynamo_plugin: TorchDynamoPlugin
    parallelism_config: ParallelismConfig | None  # the layout the code or the launcher named, sizes filled in
    layout: Layout  # the run's ranks and mesh (strategies.layout): data, collectives and strategies read it
    fp8_recipe: Any  # torchao's or Transformer Engine's recipe under fp8, else None
    device_placement: bool
    step_scheduler_with_optimizer: bool
    sync_each_batch: bool
    log_with: Any  # what the user passed: a name, a tracker, or a list of them
    trackers: list[GeneralTracker]
    step: int  # micro-batches seen by accumulate()
    _prepared: PreparedObjects
    _save_state_hooks: OrderedDict[int, Callable[..., Any]]  # register_save_state_pre_hook's, by handle id
    _load_state_hooks: OrderedDict[int, Callable[..., Any]]
    _memory_options: GuardOptions | None  # the memory guard's, read from the settings; None: off
    _memory_guard: MemoryGuard | None  # attached once a model and an optimizer are prepared
    _trigger: bool  # set_trigger() on this rank since the last check_trigger()
