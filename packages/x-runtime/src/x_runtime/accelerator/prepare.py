"""The ``Accelerator``'s ``prepare`` and what it calls: models, optimizers, schedulers, loaders.

A mixin of the facade. Each object goes to its kind's method; the strategy places and wraps
models, builds loaders and prepares optimizers, and after all of one call's objects are
prepared it may replace some (DeepSpeed's engine), which ``_apply`` puts in their places.
"""

from __future__ import annotations

from typing import Any

import torch

from x_runtime.accelerator.extract import extract_model_from_parallel
from x_runtime.accelerator.fields import AcceleratorFields
from x_runtime.accelerator.memory import attach_memory_guard
from x_runtime.accelerator.prepared import is_scheduler, kind_order
from x_runtime.accelerator.quantized import check_quantized_placement
from x_runtime.core.unwrap import unwrap_model
from x_runtime.data.loader.prepare import LoaderSpec, skip_first_batches
from x_runtime.data.sharding import Sharding
from x_runtime.optim.optimizer import AcceleratedOptimizer
from x_runtime.optim.scheduler import AcceleratedScheduler
from x_runtime.precision.dynamo import compile_model
from x_runtime.process.topology.distributed_type import DistributedType
from x_runtime.strategies.base import Replacements

__all__ = ["PrepareMethods"]


class PrepareMethods(AcceleratorFields):
    """Accelerate's ``prepare`` family, ``unwrap_model`` and ``skip_first_batches``."""

    # Accelerate's private lists of what was prepared, which code outside it reads (transformers'
    # Trainer checks ``len(accelerator._models)``): the lists x keeps, in preparation order.
    @property
    def _models(self) -> list[Any]:
        return self._prepared.models

    @property
    def _optimizers(self) -> list[Any]:
        return self._prepared.optimizers

    @property
    def _schedulers(self) -> list[Any]:
        return self._prepared.schedulers

    @property
    def _dataloaders(self) -> list[Any]:
        return self._prepared.dataloaders

    @property
    def _custom_objects(self) -> list[Any]:
        return self._prepared.custom

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
        order = sorted(range(len(args)), key=lambda i: kind_order(args[i]))
        for index in order:
            result[index] = self._prepare_one(args[index], device_placement[index])
        # DeepSpeed builds its engine here, from the model, its optimizer and its loader.
        replaced = self.strategy.finish_prepare(result, accumulation_steps=self.gradient_state.num_steps)
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
        for index, built in replaced.stand_ins.items():
            listed = self._prepared.schedulers if isinstance(built, AcceleratedScheduler) else self._prepared.optimizers
            listed.append(built)
            result[index] = built

    def _prepare_one(self, obj: Any, placement: bool) -> Any:
        if self._prepared.holds(obj):
            return obj  # prepared already (Accelerate's scripts pass prepared objects again)
        if isinstance(obj, torch.nn.Module):
            return self.prepare_model(obj, device_placement=placement)
        if isinstance(obj, torch.optim.Optimizer):
            return self.prepare_optimizer(obj, device_placement=placement)
        if isinstance(obj, torch.utils.data.DataLoader):
            return self.prepare_data_loader(obj, device_placement=placement)
        if is_scheduler(obj):
            return self.prepare_scheduler(obj)
        return obj

    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """Place ``model``, autocast its forward under mixed precision, distribute it, compile it."""
        for prepared in self._prepared.models:
            # Prepared already, as is or inside its wrapper: Accelerate hands it back, never wrapping twice.
            if model is prepared or model is unwrap_model(prepared):
                return prepared
        state = self.process_state
        check_quantized_placement(model, device=state.device, distributed=state.distributed_type != DistributedType.NO)
        if self.device_placement if device_placement is None else device_placement:
            model = self.strategy.place_model(model)
        if self.fp8_recipe is not None:
            from x_runtime.precision.fp8 import apply_fp8

            apply_fp8(model, self.fp8_recipe)
        self.precision.wrap_forward(model)
        wrapped = compile_model(self.strategy.wrap_model(model, train=not evaluation_mode), self.dynamo_plugin)
        self._prepared.models.append(wrapped)
        self._watch_memory()
        return wrapped

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None) -> Any:
        if isinstance(optimizer, AcceleratedOptimizer):
            return optimizer
        placement = self.device_placement if device_placement is None else device_placement
        prepared = AcceleratedOptimizer(
            self.strategy.prepare_optimizer(optimizer),
            gradient_state=self.gradient_state,
            scaler=self.precision.scaler,
            device=self.process_state.device if placement else None,
            before_step=self.strategy.before_step,
            after_step=self.strategy.after_step,
        )
        self._prepared.optimizers.append(prepared)
        self._watch_memory()
        return prepared

    def _watch_memory(self) -> None:
        if self._memory_guard is None:
            self._memory_guard = attach_memory_guard(
                self._memory_options, self._prepared.models, self._prepared.optimizers
            )

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        inner = getattr(scheduler, "optimizer", None)
        mine = [o for o in self._prepared.optimizers if o.optimizer is inner or o is inner]
        prepared = AcceleratedScheduler(
            scheduler,
            mine or list(self._prepared.optimizers),
            gradient_state=self.gradient_state,
            step_with_optimizer=self.step_scheduler_with_optimizer,
            split_batches=self.dataloader_config.split_batches,
            # The batches one optimizer step reads: one per data parallel rank (tensor parallel ranks share theirs).
            num_processes=self.layout.dp_size,
        )
        self._prepared.schedulers.append(prepared)
        return prepared

    def prepare_data_loader(
        self, data_loader: torch.utils.data.DataLoader[Any], device_placement: bool | None = None
    ) -> Any:
        placement = self.device_placement if device_placement is None else device_placement
        config = self.dataloader_config
        # By data parallel rank: the ranks of one tensor parallel group read the same batches.
        layout = self.layout
        sharding = Sharding(
            layout.dp_size, layout.dp_rank, config.split_batches, config.even_batches, copies=layout.copies
        )
        spec = LoaderSpec(  # the strategy gives the device and gradient state
            data_loader,
            sharding,
            dispatch_batches=config.dispatch_batches,
            use_seedable_sampler=config.use_seedable_sampler,
            data_seed=config.data_seed,
            non_blocking=config.non_blocking,
            use_stateful_dataloader=config.use_stateful_dataloader,
        )
        prepared = self.strategy.build_loader(
            spec, self.process_state.device if placement else None, self.gradient_state
        )
        self._prepared.dataloaders.append(prepared)
        return prepared

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        return skip_first_batches(dataloader, num_batches)

    def unwrap_model(
        self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> Any:
        """The user's model inside DDP (and torch.compile unless ``keep_torch_compile``)."""
        return extract_model_from_parallel(model, keep_fp32_wrapper, keep_torch_compile)
