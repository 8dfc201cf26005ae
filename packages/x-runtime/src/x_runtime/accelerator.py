"""``Accelerator``: one object that carries a training script from one CPU to many processes.

A thin facade with Accelerate's names; the work lives in small modules: ``process`` (ranks,
device, process group, collectives), ``data`` (sharded, resumable loaders), ``precision``,
``optim`` (accumulation-aware optimizer and scheduler), ``strategies`` (behind the ``Strategy``
Protocol), ``checkpoint`` and ``tracking``. Its process and collective methods come from
``process.accelerator_methods``, its saving and loading ones from ``checkpoint.accelerator_io``.
The step (``optim.accelerator_step``), tracking (``tracking.accelerator_tracking``), DDP's join and
sync triggers (``strategies.accelerator_ddp``), ``profile`` (``profiling``) and
``preemption_requested`` (``process.preemption``) are mixins too.
``accelerator.state`` is an ``AcceleratorState`` view (``state_views``) over its own process state.
Nothing is shared between two accelerators except torch's process group.
"""

from __future__ import annotations

import atexit
import os
import weakref
from typing import Any

import torch

from x_common import env
from x_runtime._forward import Forward
from x_runtime._prepared import _is_scheduler, _kind_order, _Prepared, _release_at_exit
from x_runtime.checkpoint.accelerator_io import CheckpointMethods
from x_runtime.checkpoint.random_state import set_seed
from x_runtime.configs import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    KwargsHandler,
    ProjectConfiguration,
    _Handlers,
)
from x_runtime.data.data_loader import LoaderSpec
from x_runtime.data.data_loader import skip_first_batches as _skip_first_batches
from x_runtime.data.gradient_state import check_steps
from x_runtime.data.sharding import Sharding
from x_runtime.optim.accelerator_step import StepMethods
from x_runtime.optim.optimizer import AcceleratedOptimizer
from x_runtime.optim.scheduler import AcceleratedScheduler
from x_runtime.precision.dynamo import TorchDynamoPlugin, compile_model
from x_runtime.precision.fp8 import fp8_recipe_for
from x_runtime.precision.policy import Precision, unwrap_forward
from x_runtime.process.accelerator_methods import ProcessMethods
from x_runtime.process.distributed_type import DistributedType
from x_runtime.process.preemption import PreemptionMethods
from x_runtime.process.state import ProcessState
from x_runtime.profiling import ProfileMethods
from x_runtime.state_views import AcceleratorState, GradientState
from x_runtime.strategies.accelerator_ddp import DDPMethods
from x_runtime.strategies.base import Replacements, Strategy
from x_runtime.strategies.fsdp_plugin import needs_cpu_collectives
from x_runtime.strategies.select import asked_strategy, choose_strategy
from x_runtime.strategies.unwrap import unwrap_model
from x_runtime.tracking.accelerator_tracking import TrackingMethods

__all__ = ["Accelerator"]

_UNSET: Any = object()
_RNG_TYPES = ("torch", "cuda", "mps", "xla", "xpu", "generator")


class Accelerator(
    StepMethods, ProcessMethods, PreemptionMethods, CheckpointMethods, TrackingMethods, DDPMethods, ProfileMethods
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
        project_dir: str | os.PathLike | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[KwargsHandler] | None = None,
        dynamo_backend: str | None = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
    ):
        asked = asked_strategy(fsdp_plugin, deepspeed_plugin)
        for rng in rng_types or []:
            if str(rng) not in _RNG_TYPES:
                raise ValueError(f"rng_types: {rng!r} is not one of {', '.join(_RNG_TYPES)}")
        self.handlers = _Handlers.from_list(kwargs_handlers)
        self.dataloader_config = dataloader_config or DataLoaderConfiguration()
        if split_batches is not _UNSET:
            self.dataloader_config.split_batches = bool(split_batches)
        self.project_configuration = project_config or ProjectConfiguration()
        if project_dir is not None:
            self.project_configuration.set_directories(project_dir)

        init = self.handlers.init
        process = ProcessState.from_environment(
            cpu=cpu,
            backend=init.backend,
            init_method=init.init_method,
            timeout=init.timeout,
            sharded=asked is not None,
            cpu_collectives=asked == DistributedType.FSDP and needs_cpu_collectives(fsdp_plugin),
        )
        mode = env.MIXED_PRECISION.read() if mixed_precision is None else str(mixed_precision)
        self.fp8_recipe = fp8_recipe_for(mode, process.device, self.handlers.fp8)
        self.precision = Precision(
            mode,
            process.device,
            autocast_kwargs=self.handlers.autocast.to_kwargs(),
            scaler_kwargs=self.handlers.scaler.to_kwargs(),
            native=asked != DistributedType.DEEPSPEED,
        )
        plugin = gradient_accumulation_plugin
        if plugin is not None and gradient_accumulation_steps != 1:
            raise ValueError("pass gradient_accumulation_steps or gradient_accumulation_plugin, not both")
        if plugin is None:
            steps = gradient_accumulation_steps
            if steps == 1:
                steps = env.GRADIENT_ACCUMULATION_STEPS.read()
            plugin = GradientAccumulationPlugin(num_steps=steps)
        self.gradient_state = GradientState(
            num_steps=plugin.num_steps,
            sync_with_dataloader=plugin.sync_with_dataloader,
            adjust_scheduler=plugin.adjust_scheduler,
        )
        self.sync_each_batch = plugin.sync_each_batch
        self.strategy: Strategy = choose_strategy(
            process,
            asked,
            fsdp_plugin=fsdp_plugin,
            deepspeed_plugin=deepspeed_plugin,
            mixed_precision=self.precision.mode,
            ddp_kwargs=self.handlers.ddp.to_kwargs(),
            gradient_state=self.gradient_state,
            comm_hook=self.handlers.ddp.comm_hook_spec(),
        )
        if self.strategy.distributed_type is not None:
            process.distributed_type = self.strategy.distributed_type
        self.device_placement = device_placement
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        if dynamo_plugin is not None and dynamo_backend is not None:
            raise ValueError("pass dynamo_backend or dynamo_plugin, not both")
        self.dynamo_plugin = dynamo_plugin or TorchDynamoPlugin(backend=dynamo_backend)
        # Accelerate's AcceleratorState, as a view over this accelerator's own process state.
        self.state = AcceleratorState.view_of(
            process,
            _mixed_precision=self.precision.mode,
            dynamo_plugin=self.dynamo_plugin,
            deepspeed_plugin=deepspeed_plugin,
            fsdp_plugin=fsdp_plugin,
        )
        self.log_with = log_with
        self.trackers: list[Any] = []
        self.step = 0  # micro-batches seen by accumulate()
        self._prepared = _Prepared()
        self._trigger = False
        # At exit only (not when this object is collected: another accelerator may use the group).
        atexit.register(_release_at_exit, weakref.ref(self._prepared), process)

    @staticmethod
    def _version() -> str:
        from x_runtime._version import __version__

        return __version__

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

    # --- prepare ---------------------------------------------------------------------------
    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, dataloaders and schedulers; return them in the same order.

        Anything else is returned unchanged. Models are prepared first, so optimizers and
        schedulers given before their model still see it placed.
        """
        if device_placement is None:
            device_placement = [self.device_placement] * len(args)
        if len(device_placement) != len(args):
            raise ValueError(f"device_placement has {len(device_placement)} entries for {len(args)} objects")
        result: list[Any] = list(args)
        order = sorted(range(len(args)), key=lambda i: _kind_order(args[i]))
        for index in order:
            result[index] = self._prepare_one(args[index], device_placement[index])
        # DeepSpeed builds its engine here, from the model, its optimizer and its loader.
        replaced = self.strategy.finish_prepare(result, accumulation_steps=self.gradient_accumulation_steps)
        self._apply(replaced, result)
        return result[0] if len(result) == 1 else tuple(result)

    def _apply(self, replaced: Replacements, result: list[Any]) -> None:
        """Put what the strategy replaced in place of what this prepare call prepared."""
        if replaced.num_steps is not None:
            self.gradient_state.num_steps = replaced.num_steps
        for index, model in replaced.models.items():
            self._prepared.models[self._prepared.models.index(result[index])] = model
            result[index] = model
        for index, inner in replaced.optimizers.items():
            wrapper = result[index]
            wrapper.optimizer = inner
            wrapper.steps_in_backward = True  # the strategy's optimizer steps inside backward

    def _prepare_one(self, obj: Any, placement: bool) -> Any:
        if self._prepared.holds(obj):
            return obj  # prepared already (Accelerate's scripts pass prepared objects again)
        if isinstance(obj, torch.nn.Module):
            return self.prepare_model(obj, device_placement=placement)
        if isinstance(obj, torch.optim.Optimizer):
            return self.prepare_optimizer(obj, device_placement=placement)
        if isinstance(obj, torch.utils.data.DataLoader):
            return self.prepare_data_loader(obj, device_placement=placement)
        if _is_scheduler(obj):
            return self.prepare_scheduler(obj)
        return obj

    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """Place ``model``, autocast its forward under mixed precision, distribute it, compile it."""
        if any(model is m or model is unwrap_model(m) for m in self._prepared.models):
            raise ValueError("this model is already prepared; prepare each model once")
        if self.device_placement if device_placement is None else device_placement:
            model = self.strategy.place_model(model)
        if self.fp8_recipe is not None:
            from x_runtime.precision.fp8 import apply_fp8

            apply_fp8(model, self.fp8_recipe)
        self.precision.wrap_forward(model)
        wrapped = compile_model(self.strategy.wrap_model(model, train=not evaluation_mode), self.dynamo_plugin)
        self._prepared.models.append(wrapped)
        return wrapped

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None) -> Any:
        if isinstance(optimizer, AcceleratedOptimizer):
            return optimizer
        placement = self.device_placement if device_placement is None else device_placement
        prepared = AcceleratedOptimizer(
            self.strategy.prepare_optimizer(optimizer),
            gradient_state=self.gradient_state,
            scaler=self.precision.scaler,
            device=self.device if placement else None,
            before_step=self.strategy.before_step,
            after_step=self.strategy.after_step,
        )
        self._prepared.optimizers.append(prepared)
        return prepared

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        inner = getattr(scheduler, "optimizer", None)
        mine = [o for o in self._prepared.optimizers if o.optimizer is inner or o is inner]
        prepared = AcceleratedScheduler(
            scheduler,
            mine or list(self._prepared.optimizers),
            gradient_state=self.gradient_state,
            step_with_optimizer=self.step_scheduler_with_optimizer,
            split_batches=self.split_batches,
            num_processes=self.num_processes,
        )
        self._prepared.schedulers.append(prepared)
        return prepared

    def prepare_data_loader(
        self, data_loader: torch.utils.data.DataLoader, device_placement: bool | None = None
    ) -> Any:
        placement = self.device_placement if device_placement is None else device_placement
        config = self.dataloader_config
        sharding = Sharding(self.num_processes, self.process_index, config.split_batches, config.even_batches)
        spec = LoaderSpec(  # the strategy gives the device and gradient state
            data_loader,
            sharding,
            dispatch_batches=config.dispatch_batches,
            use_seedable_sampler=config.use_seedable_sampler,
            data_seed=config.data_seed,
            non_blocking=config.non_blocking,
            use_stateful_dataloader=config.use_stateful_dataloader,
        )
        prepared = self.strategy.build_loader(spec, self.device if placement else None, self.gradient_state)
        self._prepared.dataloaders.append(prepared)
        return prepared

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        return _skip_first_batches(dataloader, num_batches)

    def unwrap_model(
        self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> Any:
        """The user's model inside DDP (and torch.compile unless ``keep_torch_compile``)."""
        inner = unwrap_model(model, keep_torch_compile=keep_torch_compile)
        if not keep_fp32_wrapper:
            unwrap_forward(inner)
        return inner

    # --- memory ----------------------------------------------------------------------------
    def free_memory(self, *objects: Any) -> list[None]:
        """Forget everything prepared, collect garbage, empty device caches; returns Nones."""
        from x_runtime.memory import release_memory

        self._prepared.clear()
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
