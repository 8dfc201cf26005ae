"""``Accelerator``: one object that carries a training script from one CPU to many processes.

A thin facade with Accelerate's names over the layers below it (``core``, ``io``, ``process``,
``data``, ``precision``, ``optim``, ``strategies``, ``checkpoint``, ``tracking``). This module
holds ``__init__``, which decides the strategy once (``strategies.select.decide``), joins the
process group and sets the fields ``fields.AcceleratorFields`` declares; the methods come from one
mixin per concern in this folder: ``prepare``, ``step``, ``processes``, ``checkpoints``,
``tracking``, ``ddp``, ``profile``, ``preemption``. ``accelerator.state`` is an ``AcceleratorState``
view (``state_views``) over its own process state. Nothing is shared between two accelerators
except torch's process group.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

from x_common import env
from x_runtime.accelerator.checkpoints import CheckpointMethods
from x_runtime.accelerator.ddp import DDPMethods
from x_runtime.accelerator.forward import Forward
from x_runtime.accelerator.memory import memory_guard_options
from x_runtime.accelerator.preemption import PreemptionMethods
from x_runtime.accelerator.prepare import PrepareMethods
from x_runtime.accelerator.prepared import PreparedObjects, release_at_exit
from x_runtime.accelerator.processes import ProcessMethods
from x_runtime.accelerator.profile import ProfileMethods
from x_runtime.accelerator.state_views import AcceleratorState, GradientState, remember_accelerator_state
from x_runtime.accelerator.step import StepMethods
from x_runtime.accelerator.tracking import TrackingMethods
from x_runtime.core.configs import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    Handlers,
    KwargsHandler,
    ProjectConfiguration,
)
from x_runtime.core.one_line_errors import install_one_line_hook, set_rank
from x_runtime.core.parallelism import ParallelismConfig
from x_runtime.core.random_state import set_seed
from x_runtime.core.settings import Settings, building
from x_runtime.data.gradient_state import check_steps
from x_runtime.precision.dynamo import TorchDynamoPlugin
from x_runtime.precision.fp8 import fp8_recipe_for
from x_runtime.precision.policy import Precision
from x_runtime.process.operations.progress import open_progress
from x_runtime.process.topology.distributed_type import DistributedType
from x_runtime.strategies.select import decide

__all__ = ["Accelerator"]

_UNSET: Any = object()
_RNG_TYPES = ("torch", "cuda", "mps", "xla", "xpu", "generator")


class Accelerator(
    PrepareMethods,
    StepMethods,
    ProcessMethods,
    PreemptionMethods,
    CheckpointMethods,
    TrackingMethods,
    DDPMethods,
    ProfileMethods,
):
    """Prepare model, optimizer, dataloaders and scheduler once; the loop stays plain PyTorch.

    Args:
        device_placement: move prepared models and batches to ``self.device``.
        split_batches: deprecated spelling of ``DataLoaderConfiguration(split_batches=...)``.
        mixed_precision: "no", "fp16" (GPU) or "bf16"; ``None`` takes the launcher's choice.
        gradient_accumulation_steps: micro-batches per optimizer step (launcher's if 1).
        cpu: compute on CPU even when an accelerator is present.
        dataloader_config: how dataloaders are sharded, see ``DataLoaderConfiguration``.
        log_with: trackers, e.g. "tensorboard" or ["tensorboard", "wandb"] or "all".
        project_dir: folder for checkpoints and logs.
        project_config: checkpoint naming and pruning, see ``ProjectConfiguration``.
        step_scheduler_with_optimizer: the scheduler advances with optimizer steps.
        kwargs_handlers: ``DistributedDataParallelKwargs``, ``GradScalerKwargs``,
            ``InitProcessGroupKwargs``, ``AutocastKwargs``.
        rng_types: accepted for compatibility; data order never depends on synchronised
            generators here (the shuffling sampler is seeded), so nothing needs syncing.
        dynamo_backend: ``torch.compile`` backend for prepared models ("no" to disable).
        dynamo_plugin: ``TorchDynamoPlugin`` (mode, fullgraph, regional compilation); not with
            ``dynamo_backend``.
        fsdp_plugin: shard the model with FSDP2 (else the launcher's ``distributed_type``).
        deepspeed_plugin: train through a DeepSpeed engine (ZeRO stages 0-3).
        parallelism_config: ``ParallelismConfig``: the layout over replicas, shards and tensor
            parallel ranks (DDP, FSDP2, HSDP, TP, FSDP2 x TP, HSDP x TP); else the launcher's
            ``--parallelism_config_*`` sizes. Sequence parallelism is refused in one line.

    Examples:
        >>> import torch
        >>> accelerator = Accelerator(cpu=True)
        >>> model = torch.nn.Linear(2, 1)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> model, optimizer = accelerator.prepare(model, optimizer)
        >>> loss = model(torch.ones(4, 2)).pow(2).mean()
        >>> accelerator.backward(loss)
        >>> optimizer.step(); optimizer.zero_grad()
        >>> accelerator.num_processes, accelerator.device.type
        (1, 'cpu')
    """

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool = _UNSET,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        dataloader_config: DataLoaderConfiguration | None = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        rng_types: list[str] | None = None,
        log_with: Any = None,
        project_dir: str | os.PathLike[str] | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[KwargsHandler] | None = None,
        dynamo_backend: str | None = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        parallelism_config: ParallelismConfig | None = None,
    ):
        # The launcher's settings, read once: everything built below takes them from this snapshot
        # (plugins built here too, through current_settings()).
        with building(Settings.read()) as settings:
            for rng in rng_types or []:
                if str(rng) not in _RNG_TYPES:
                    raise ValueError(f"rng_types: {rng!r} is not one of {', '.join(_RNG_TYPES)}")
            self.handlers = Handlers.from_list(kwargs_handlers)
            self.dataloader_config = dataloader_config or DataLoaderConfiguration()
            if split_batches is not _UNSET:
                self.dataloader_config.split_batches = bool(split_batches)
            self.project_configuration = project_config or ProjectConfiguration()
            if project_dir is not None:
                self.project_configuration.set_directories(project_dir)

            # A missing checkpoint folder or a layout x cannot train ends the script in one line (once per
            # job), not a traceback per rank; installed before the layout is decided and the group joined.
            install_one_line_hook(
                traceback=settings.get(env.DEBUG_MODE), ranks_on_host=settings.get(env.LOCAL_WORLD_SIZE) or 1
            )
            set_rank(settings.get(env.RANK) or 0)
            init = self.handlers.init
            choice = decide(
                fsdp_plugin=fsdp_plugin,
                deepspeed_plugin=deepspeed_plugin,
                backend=init.backend,
                init_method=init.init_method,
                timeout=init.timeout,
                settings=settings,
                parallelism_config=parallelism_config,
            )
            process = choice.join(cpu=cpu)
            self.process_state = process
            open_progress(process.rank, settings.environ)  # under x-launch: the stall watchdog's record and stack dump
            set_rank(process.rank)
            self.layout = choice.layout(process)
            # Accelerate's: the configuration the code or the launcher gave (FSDP's implied one stays unnamed).
            self.parallelism_config = self.layout.config if choice.parallelism is not None else None
            mode = settings.get(env.MIXED_PRECISION) if mixed_precision is None else str(mixed_precision)
            self.fp8_recipe = fp8_recipe_for(mode, process.device, self.handlers.fp8)
            self.precision = Precision(
                mode,
                process.device,
                autocast_kwargs=self.handlers.autocast.to_kwargs(),
                scaler_kwargs=self.handlers.scaler.to_kwargs(),
                native=choice.kind != DistributedType.DEEPSPEED,
            )
            plugin = gradient_accumulation_plugin
            if plugin is not None and gradient_accumulation_steps != 1:
                raise ValueError("pass gradient_accumulation_steps or gradient_accumulation_plugin, not both")
            if plugin is None:
                steps = gradient_accumulation_steps
                if steps == 1:
                    steps = settings.get(env.GRADIENT_ACCUMULATION_STEPS)
                plugin = GradientAccumulationPlugin(num_steps=steps)
            self.gradient_state = GradientState(plugin)
            self.sync_each_batch = plugin.sync_each_batch
            self.strategy = choice.build(
                process,
                mixed_precision=self.precision.mode,
                ddp_kwargs=self.handlers.ddp.to_kwargs(),
                gradient_state=self.gradient_state,
                comm_hook=self.handlers.ddp.comm_hook_spec(),
                layout=self.layout,
            )
            self.device_placement = device_placement
            self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
            if dynamo_plugin is not None and dynamo_backend is not None:
                raise ValueError("pass dynamo_backend or dynamo_plugin, not both")
            self.dynamo_plugin = dynamo_plugin or TorchDynamoPlugin(backend=dynamo_backend)
            self._memory_options = memory_guard_options(
                settings,
                process=process,
                precision=self.precision.mode,
                kind=choice.kind,
                accumulation=self.gradient_state.num_steps,
                compiled=self.dynamo_plugin.enabled,
                split=self.layout.tp_size > 1,
            )
            self._memory_guard = None
            # Accelerate's AcceleratorState, as a view over this accelerator's own process state. Its plugin is the
            # one in effect, also when the launcher chose the strategy (transformers' Trainer reads it to pick
            # its checkpoint paths); and, as Accelerate does, the process says so in Accelerate's variables,
            # which libraries read before they load a model (TRL's reference model, FSDP's rank-0 loading).
            in_effect = getattr(self.strategy, "plugin", None)
            sharded = choice.kind in (DistributedType.FSDP, DistributedType.DEEPSPEED)
            if sharded:
                os.environ.update(env.DISTRIBUTED_TYPE.accelerate_spelling(str(choice.kind)))
            self.state = AcceleratorState.view_of(
                process,
                _mixed_precision=self.precision.mode,
                dynamo_plugin=self.dynamo_plugin,
                deepspeed_plugin=in_effect if choice.kind == DistributedType.DEEPSPEED else None,
                fsdp_plugin=in_effect if choice.kind == DistributedType.FSDP else None,
                parallelism_config=self.parallelism_config,
                device_mesh=self.layout.mesh if self.parallelism_config is not None else None,
            )
            remember_accelerator_state(self.state)
            self.log_with = log_with
            if log_with is not None:  # an unknown name, a missing package or directory fails here, not at init_trackers
                from x_runtime.tracking.registry import filter_trackers

                filter_trackers(log_with, self.project_configuration.logging_dir)
            self.trackers = []
            self.step = 0
            self._prepared = PreparedObjects()
            self._save_state_hooks = OrderedDict()  # RemovableHandle needs a weakly referenceable dict
            self._load_state_hooks = OrderedDict()
            self._trigger = False
            # At exit only (not when this object is collected: another accelerator may use the group).
            release_at_exit.add(self._prepared, process)

    # --- where this process is (Accelerate's names over state and configs) --------------------
    device = Forward("state", "device")
    distributed_type = Forward("state", "distributed_type")
    num_processes = Forward("state", "world_size")
    process_index = Forward("state", "rank")
    local_process_index = Forward("state", "local_rank")
    is_main_process = Forward("state", "is_main_process")
    is_local_main_process = Forward("state", "is_local_main_process")
    is_last_process = Forward("state", "is_last_process")
    use_distributed = Forward("state", "use_distributed")
    mixed_precision = Forward("precision", "mode")
    scaler = Forward("precision", "scaler")
    split_batches = Forward("dataloader_config", "split_batches")
    even_batches = Forward("dataloader_config", "even_batches", writable=True)
    dispatch_batches = Forward("dataloader_config", "dispatch_batches")
    non_blocking = Forward("dataloader_config", "non_blocking")
    project_dir = Forward("project_configuration", "project_dir")
    logging_dir = Forward("project_configuration", "logging_dir")
    save_iteration = Forward("project_configuration", "iteration")
    sync_gradients = Forward("gradient_state", "sync_gradients", writable=True)
    dynamo_backend = Forward("dynamo_plugin", "backend")

    # --- the layout (Accelerate's names over strategies.layout) ---------------------------------
    @property
    def torch_device_mesh(self) -> Any:
        """The run's ``DeviceMesh`` (named dimensions and the flattened ``dp``, ``dp_shard_cp``, ``dp_cp``).

        ``None`` unless a ``ParallelismConfig`` was given (in code or by the launcher), as in Accelerate.
        """
        return self.state.device_mesh

    def _mesh_rank(self, dim: str, what: str) -> int:
        config = self.parallelism_config
        if config is None:
            raise RuntimeError(f"{what} is not configured. Set `parallelism_config` first.")
        return self.layout.local_rank(dim)

    @property
    def tensor_parallel_rank(self) -> int:
        return self._mesh_rank("tp", "Tensor parallelism")

    @property
    def data_parallel_rank(self) -> int:
        """This rank's place among the replicas (``dp_replicate``), 0 when there are none."""
        return self._mesh_rank("dp_replicate", "Data parallelism")

    @property
    def data_parallel_shard_rank(self) -> int:
        return self._mesh_rank("dp_shard", "Shard-based data parallelism")

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        self.gradient_state.num_steps = check_steps(steps)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped (fp16 overflow)."""
        return any(opt.step_was_skipped for opt in self._prepared.optimizers)

    # --- memory ----------------------------------------------------------------------------
    def free_memory(self, *objects: Any) -> list[None]:
        """Forget everything prepared, collect garbage, empty device caches; returns Nones."""
        from x_runtime.core.memory import release_memory

        self._prepared.clear()
        if self._memory_guard is not None:  # it holds the model and optimizer it watched
            self._memory_guard.close()
            self._memory_guard = None
        self.step = 0
        return release_memory(*objects)

    clear = free_memory

    def set_seed(self, seed: int, device_specific: bool = False, deterministic: bool = False) -> int:
        return set_seed(seed, device_specific, deterministic, process_index=self.process_index)

    def __repr__(self) -> str:
        return (
            f"Accelerator(distributed_type={self.distributed_type}, process {self.process_index} of "
            f"{self.num_processes}, device={self.device}, mixed_precision={self.mixed_precision}, "
            f"gradient_accumulation_steps={self.gradient_accumulation_steps})"
        )
