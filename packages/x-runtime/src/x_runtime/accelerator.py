"""``Accelerator``: one object that carries a training script from one CPU to many processes.

A thin facade with Accelerate's names; the work lives in small modules: ``state`` (ranks,
device, process group), ``data_loader`` (sharded, resumable loaders), ``collectives``,
``precision``, ``optimizer`` / ``scheduler`` (accumulation-aware wrappers), ``checkpointing``
and ``tracking``. Nothing is shared between two accelerators except torch's process group.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import os
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from x_common import env
from x_runtime import collectives, nested
from x_runtime._forward import Forward
from x_runtime._prepared import (
    _as_list,
    _is_scheduler,
    _kind_order,
    _leaves,
    _Prepared,
    _release_at_exit,
    _unwrap,
)
from x_runtime.checkpoint_naming import load_source, note_loaded, note_saved, save_target
from x_runtime.checkpointing import CheckpointParts, load_checkpoint, save_checkpoint
from x_runtime.configs import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    KwargsHandler,
    ProjectConfiguration,
    _Handlers,
)
from x_runtime.data_loader import prepare_data_loader
from x_runtime.data_loader import skip_first_batches as _skip_first_batches
from x_runtime.gradient_state import GradientState, check_steps
from x_runtime.model_files import save_object, save_state_dict_files
from x_runtime.optimizer import AcceleratedOptimizer
from x_runtime.precision import Precision, unwrap_forward
from x_runtime.process_helpers import first_on, on_process, split_between_processes
from x_runtime.random_state import set_seed
from x_runtime.scheduler import AcceleratedScheduler
from x_runtime.state import ProcessState
from x_runtime.strategies.dynamo import TorchDynamoPlugin, compile_model
from x_runtime.strategies.fp8 import fp8_recipe_for
from x_runtime.strategies.select import asked_strategy, choose_strategy

__all__ = ["Accelerator"]

_UNSET: Any = object()
_RNG_TYPES = ("torch", "cuda", "mps", "xla", "xpu", "generator")


class Accelerator:
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
        self.state = ProcessState.from_environment(
            cpu=cpu, backend=init.backend, init_method=init.init_method, timeout=init.timeout, sharded=asked is not None
        )
        mode = env.MIXED_PRECISION.read() if mixed_precision is None else str(mixed_precision)
        self.fp8_recipe = fp8_recipe_for(mode, self.state.device, self.handlers.fp8)
        self.precision = Precision(
            mode,
            self.state.device,
            autocast_kwargs=self.handlers.autocast.to_kwargs(),
            scaler_kwargs=self.handlers.scaler.to_kwargs(),
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
        self.strategy = choose_strategy(
            self.state,
            asked,
            fsdp_plugin=fsdp_plugin,
            deepspeed_plugin=deepspeed_plugin,
            mixed_precision=self.precision.mode,
            ddp_kwargs=self.handlers.ddp.to_kwargs(),
            gradient_state=self.gradient_state,
        )
        if self.strategy.distributed_type is not None:
            self.state.distributed_type = self.strategy.distributed_type
        self.device_placement = device_placement
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        if dynamo_plugin is not None and dynamo_backend is not None:
            raise ValueError("pass dynamo_backend or dynamo_plugin, not both")
        self.dynamo_plugin = dynamo_plugin or TorchDynamoPlugin(backend=dynamo_backend)
        self.log_with = log_with
        self.trackers: list[Any] = []
        self.step = 0  # micro-batches seen by accumulate()
        self._prepared = _Prepared()
        self._trigger = False
        # At exit only (not when this object is collected: another accelerator may use the group).
        atexit.register(_release_at_exit, weakref.ref(self._prepared), self.state)

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
        result = self.strategy.finish_prepare(result, self)  # DeepSpeed builds its engine here
        return result[0] if len(result) == 1 else tuple(result)

    def _prepare_one(self, obj: Any, placement: bool) -> Any:
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
        if any(model is m or model is _unwrap(m) for m in self._prepared.models):
            raise ValueError("this model is already prepared; prepare each model once")
        if self.device_placement if device_placement is None else device_placement:
            model = self.strategy.place_model(model)
        if self.fp8_recipe is not None:
            from x_runtime.strategies.fp8 import apply_fp8

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

        build = functools.partial(  # the strategy gives the device and gradient state
            prepare_data_loader,
            data_loader,
            num_processes=self.num_processes,
            process_index=self.process_index,
            split_batches=config.split_batches,
            even_batches=config.even_batches,
            dispatch_batches=config.dispatch_batches,
            use_seedable_sampler=config.use_seedable_sampler,
            data_seed=config.data_seed,
            non_blocking=config.non_blocking,
            use_stateful_dataloader=config.use_stateful_dataloader,
        )
        prepared = self.strategy.build_loader(build, self.device if placement else None, self.gradient_state)
        self._prepared.dataloaders.append(prepared)
        return prepared

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        return _skip_first_batches(dataloader, num_batches)

    def unwrap_model(
        self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> Any:
        """The user's model inside DDP (and torch.compile unless ``keep_torch_compile``)."""
        inner = _unwrap(model, keep_torch_compile=keep_torch_compile)
        if not keep_fp32_wrapper:
            unwrap_forward(inner)
        return inner

    # --- the step --------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()`` divided over accumulation steps, scaled under fp16."""
        if self.gradient_state.num_steps > 1 and not self.strategy.scales_loss_for_accumulation:
            loss = loss / self.gradient_state.num_steps
        self.strategy.backward(loss, self.precision.scaler, **kwargs)

    def _do_sync(self) -> None:
        state = self.gradient_state
        if state.sync_with_dataloader and state.end_of_dataloader:
            self.step = 0
            state.sync_gradients = True
        else:
            self.step += 1
            state.sync_gradients = self.step % state.num_steps == 0

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Skip the gradient all-reduce / reduce-scatter inside the block (gradients accumulate locally)."""
        with self.strategy.no_sync(_unwrap(model, keep_torch_compile=False, through_ddp=False)):
            yield

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """One micro-batch: gradients sync only on accumulation boundaries and the last batch."""
        self._do_sync()
        with contextlib.ExitStack() as stack:
            if not (self.sync_gradients or self.sync_each_batch):
                for model in models:
                    stack.enter_context(self.no_sync(model))
            yield

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Divide gradients by the fp16 loss scale (once per step); no-op otherwise."""
        if self.precision.scaler is None:
            return
        targets = self._prepared.optimizers if optimizer is None else _as_list(optimizer)
        for opt in targets:
            if isinstance(opt, AcceleratedOptimizer):
                opt.unscale()

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor:
        """Clip the gradient norm (after unscaling under fp16); returns the total norm."""
        self.unscale_gradients()
        return self.strategy.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        self.unscale_gradients()
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    def autocast(self, autocast_handler: Any = None) -> contextlib.AbstractContextManager:
        """Autocast under this accelerator's mixed precision (no-op without it)."""
        overrides = autocast_handler.to_kwargs() if autocast_handler is not None else {}
        return self.precision.autocast(**overrides)

    # --- collectives -----------------------------------------------------------------------
    def gather(self, tensor: Any) -> Any:
        """Every process's tensors concatenated along dim 0 (nested structures kept)."""
        return collectives.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """``gather`` minus the samples duplicated to even out the last batch.

        Over a whole epoch the gathered results hold exactly ``len(dataset)`` samples, in order.
        Non-tensor data (or ``use_gather_object=True``) goes through ``gather_object``.
        """
        tensors_only = all(isinstance(t, torch.Tensor) for t in _leaves(input_data))
        if use_gather_object or not tensors_only:
            data = collectives.gather_object(input_data)
        else:
            data = collectives.gather(input_data)
        state = self.gradient_state
        if not state.end_of_dataloader or state.remainder < 0:
            return data
        if use_gather_object or not tensors_only:
            return data[: state.remainder]
        return nested.slice_batch(data, slice(0, state.remainder))

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
        return collectives.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        return collectives.reduce(tensor, reduction=reduction, scale=scale)

    def set_trigger(self) -> None:
        """Flag a condition on this process; ``check_trigger`` sees it on every process."""
        self._trigger = True

    def check_trigger(self) -> bool:
        """Whether any process called ``set_trigger`` since the last check (resets it)."""
        flag = torch.tensor([1.0 if self._trigger else 0.0], device=self._collective_device())
        fired = bool(collectives.reduce(flag, reduction="sum").item() > 0)
        if fired:
            self._trigger = False
        return fired

    def _collective_device(self) -> torch.device:
        return self.device if self.state.backend in ("nccl", "xccl", "xla") else torch.device("cpu")

    # --- processes -------------------------------------------------------------------------
    def wait_for_everyone(self) -> None:
        self.state.wait_for_everyone()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the local main process only."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    def main_process_first(self) -> contextlib.AbstractContextManager:
        return first_on(self.state, self.is_main_process)

    def local_main_process_first(self) -> contextlib.AbstractContextManager:
        return first_on(self.state, self.is_local_main_process)

    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return on_process(self.state, lambda s: s.is_main_process)(function)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return on_process(self.state, lambda s: s.is_local_main_process)(function)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return on_process(self.state, lambda s: s.is_last_process)(function)

    def on_process(self, function: Callable[..., Any] | None = None, process_index: int | None = None) -> Any:
        if process_index is None:
            raise ValueError("on_process needs process_index, e.g. @accelerator.on_process(process_index=1)")
        decorate = on_process(self.state, lambda s: s.rank == process_index)
        return decorate if function is None else decorate(function)

    def on_local_process(
        self, function: Callable[..., Any] | None = None, local_process_index: int | None = None
    ) -> Any:
        if local_process_index is None:
            raise ValueError("on_local_process needs local_process_index")
        decorate = on_process(self.state, lambda s: s.local_rank == local_process_index)
        return decorate if function is None else decorate(function)

    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> contextlib.AbstractContextManager:
        return split_between_processes(self.state, inputs, apply_padding=apply_padding)

    # --- checkpoints -----------------------------------------------------------------------
    def register_for_checkpointing(self, *objects: Any) -> None:
        """Also save and restore these objects (each needs ``state_dict``/``load_state_dict``)."""
        invalid = [
            type(o).__name__ for o in objects if not (hasattr(o, "state_dict") and hasattr(o, "load_state_dict"))
        ]
        if invalid:
            raise TypeError(f"register_for_checkpointing: {', '.join(invalid)} lack state_dict/load_state_dict")
        self._prepared.custom.extend(objects)

    def _parts(self) -> CheckpointParts:
        return CheckpointParts(
            models=[_unwrap(m) for m in self._prepared.models],
            optimizers=list(self._prepared.optimizers),
            schedulers=list(self._prepared.schedulers),
            dataloaders=list(self._prepared.dataloaders),
            custom=list(self._prepared.custom),
            scaler=self.precision.scaler,
            strategy=self.strategy,
        )

    def save_state(self, output_dir: str | os.PathLike | None = None, safe_serialization: bool = True) -> str:
        """Save models, optimizers, schedulers, scaler, RNG states, loader positions, registered objects.

        Every process must call it. The folder appears complete or not at all.
        """
        if not safe_serialization:
            raise ValueError("safe_serialization=False: x_runtime writes weights as safetensors only")
        target = save_target(self.project_configuration, output_dir)
        save_checkpoint(target, self._parts(), self.state)
        note_saved(self.project_configuration, is_main_process=self.is_main_process)
        self.wait_for_everyone()
        return str(target)

    def load_state(self, input_dir: str | os.PathLike | None = None, strict: bool = True) -> str:
        """Restore what ``save_state`` saved (the latest automatic checkpoint when no folder given)."""
        source = load_source(self.project_configuration, input_dir)
        folder = load_checkpoint(source, self._parts(), self.state, strict=strict)
        note_loaded(self.project_configuration, folder)
        return str(folder)

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """The whole model's weights; sharded models are gathered to the main process (every rank calls)."""
        return self.strategy.state_dict(_unwrap(model) if unwrap else model)

    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: str | os.PathLike,
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Weights as ``model.safetensors``, or shards plus ``model.safetensors.index.json``."""
        if not safe_serialization:
            raise ValueError("safe_serialization=False: x_runtime writes weights as safetensors only")
        if Path(save_directory).is_file():
            raise ValueError(f"save_model: {save_directory} is a file; give a directory")
        state_dict = self.get_state_dict(model)
        if self.is_main_process:
            save_state_dict_files(state_dict, save_directory, max_shard_size=max_shard_size)
        self.wait_for_everyone()

    def save(self, obj: Any, f: str | os.PathLike, safe_serialization: bool = False) -> None:
        """``torch.save`` (or safetensors for a dict of tensors) on the main process only."""
        obj = self.strategy.to_host(obj)  # every process: on XLA this runs the graph that makes obj
        if self.is_main_process:
            save_object(obj, f, safe_serialization=safe_serialization)

    # --- tracking --------------------------------------------------------------------------
    def init_trackers(self, project_name: str, config: dict | None = None, init_kwargs: dict | None = None) -> None:
        """Start the trackers named by ``log_with`` (main process only) and store ``config``."""
        if not self.is_main_process or self.log_with is None:
            return
        from x_runtime.tracking import build_trackers

        self.trackers = build_trackers(self.log_with, project_name, self.logging_dir, init_kwargs or {})
        if config is not None:
            for tracker in self.trackers:
                tracker.store_init_configuration(config)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        raise ValueError(f"no tracker named {name!r}; started: {[t.name for t in self.trackers] or 'none'}")

    def log(self, values: dict, step: int | None = None, log_kwargs: dict | None = None) -> None:
        """Log ``values`` to every tracker (main process only)."""
        for tracker in self.trackers:
            tracker.log(values, step=step, **(log_kwargs or {}).get(tracker.name, {}))

    def end_training(self) -> None:
        """Close trackers, wait for every process, and release what was prepared.

        The process group stays up until the interpreter exits (then it is left cleanly):
        re-creating a group in the same process after destroying it hangs the first collective
        under torchrun (torch 2.13, its agent's store), so a later ``Accelerator`` in this
        process joins the existing group instead.
        """
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []
        self.wait_for_everyone()
        self._prepared.clear()
        gc.collect()

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
