"""The ``Accelerator``'s methods around one training step: backward, accumulation, clipping, autocast.

A mixin of the facade: the loss is divided over accumulation steps (unless the strategy does
it), gradients sync only on boundaries (``no_sync`` elsewhere), and clipping unscales fp16
gradients first; the strategy does the distributed part of each.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from x_runtime.accelerator.fields import AcceleratorFields
from x_runtime.core.unwrap import unwrap_model
from x_runtime.optim.optimizer import AcceleratedOptimizer
from x_runtime.process.operations import progress

__all__ = ["StepMethods"]


class StepMethods(AcceleratorFields):
    """Accelerate's step methods, over ``self.strategy``, ``self.precision`` and ``self.gradient_state``."""

    # --- the step --------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()`` divided over accumulation steps, scaled under fp16."""
        if self.gradient_state.num_steps > 1 and not self.strategy.scales_loss_for_accumulation:
            loss = loss / self.gradient_state.num_steps
        progress.enter(progress.Phase.BACKWARD)  # x-launch's stall watchdog: DDP's all-reduce waits in here
        try:
            self.strategy.backward(loss, self.precision.scaler, **kwargs)
        finally:
            progress.leave()

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
        with self.strategy.no_sync(unwrap_model(model, keep_torch_compile=False, through_ddp=False)):
            yield

    @contextlib.contextmanager
    def maybe_context_parallel(
        self,
        buffers: list[torch.Tensor] | None = None,
        buffer_seq_dims: list[int] | None = None,
        no_restore_buffers: set[torch.Tensor] | None = None,
    ) -> Iterator[None]:
        """Accelerate's context-parallel block: inside it, ``buffers`` (inputs, labels, position ids) are
        split along ``buffer_seq_dims`` over the ``cp`` ranks and SDPA attention runs as torch's ring
        attention (``torch.distributed.tensor.experimental.context_parallel``), exchanging keys and
        values by the handler's ``cp_comm_strategy``. Without context parallelism (``cp_size`` 1) it
        leaves the buffers whole and does nothing, as Accelerate's does; transformers' Trainer enters
        it each step. Context parallelism runs on GPUs only (refused on CPU when the Accelerator is built).
        """
        mesh = self.layout.cp_mesh
        if mesh is None:
            yield
            return
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import set_rotate_method

        handler = self.parallelism_config.cp_handler if self.parallelism_config is not None else None
        set_rotate_method(getattr(handler, "cp_comm_strategy", None) or "allgather")
        with context_parallel(
            mesh,
            buffers=buffers or [],
            buffer_seq_dims=buffer_seq_dims or [],
            no_restore_buffers=no_restore_buffers or set(),
        ):
            yield

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """One micro-batch: gradients sync only on accumulation boundaries and the last batch."""
        self._do_sync()
        with contextlib.ExitStack() as stack:
            if not (self.gradient_state.sync_gradients or self.sync_each_batch):
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

    def autocast(self, autocast_handler: Any = None) -> contextlib.AbstractContextManager[Any]:
        """Autocast under this accelerator's mixed precision (no-op without it)."""
        overrides = autocast_handler.to_kwargs() if autocast_handler is not None else {}
        return self.precision.autocast(**overrides)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]
