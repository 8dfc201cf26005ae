"""The ``Accelerator``'s DDP methods: ``join_uneven_inputs`` and ``trigger_sync_in_backward``.

A mixin of the facade. ``join_uneven_inputs`` runs torch's ``Join`` over the prepared DDP
models whenever several processes train with DDP, over gloo on CPU as over NCCL on GPUs
(Accelerate limits it to GPUs): a rank that runs out of batches shadows the others'
all-reduces instead of leaving them waiting. ``even_batches`` overrides the accelerator's
setting for the prepared map-style loaders for the length of the block.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from x_runtime.accelerator.fields import AcceleratorFields
from x_runtime.process.topology.distributed_type import DistributedType

__all__ = ["DDPMethods"]

_DDP_TYPES = (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU, DistributedType.MULTI_XPU)


def _shard_of(loader: Any) -> Any:
    """The sharding batch sampler under a prepared loader (None for an iterable, dispatched one)."""
    sampler = getattr(loader, "batch_sampler", None)
    while sampler is not None and not hasattr(sampler, "sharding"):
        sampler = getattr(sampler, "batch_sampler", None)
    return sampler


class DDPMethods(AcceleratorFields):
    """Accelerate's DDP-only methods, over the prepared models and loaders."""

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: list[Any], even_batches: bool | None = None) -> Iterator[None]:
        """Train or evaluate on inputs whose batches run out at different steps on different ranks.

        Args:
            joinables: the prepared DDP models (any ``torch.distributed.algorithms.Joinable``).
            even_batches: override ``even_batches`` of the prepared map-style loaders inside the
                block (iterable, dispatched loaders cannot be changed: a warning says so).

        Examples:
            >>> from x_runtime import Accelerator
            >>> accelerator = Accelerator(cpu=True)
            >>> with accelerator.join_uneven_inputs([]):  # one process: nothing to join
            ...     pass
        """
        state = self.process_state
        if not (state.use_distributed and state.distributed_type in _DDP_TYPES):
            if state.distributed_type != DistributedType.NO:
                warnings.warn(
                    "Joining uneven inputs is only supported for multi-GPU and multi-CPU DDP training; "
                    f"under {state.distributed_type} join_uneven_inputs has no effect",
                    UserWarning,
                    stacklevel=3,
                )
            yield
            return
        from torch.distributed.algorithms.join import Join

        saved: list[tuple[Any, Any]] = []
        if even_batches is not None:
            iterable_seen = False
            for loader in self._prepared.dataloaders:
                shard = _shard_of(loader)
                if shard is None:
                    iterable_seen = True
                    continue
                saved.append((shard, shard.sharding))
                shard.sharding = dataclasses.replace(shard.sharding, even_batches=even_batches)
            if iterable_seen:
                warnings.warn(
                    "Overriding even_batches is only supported for map-style datasets, yet some dataloaders given "
                    "were iterable",
                    UserWarning,
                    stacklevel=3,
                )
        else:
            even_batches = self.dataloader_config.even_batches
        try:
            with Join(joinables, enable=not even_batches, throw_on_early_termination=False):
                yield
        finally:
            for shard, sharding in saved:
                shard.sharding = sharding

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: torch.nn.Module) -> Iterator[None]:
        """Make the next ``backward`` of a DDP ``model`` all-reduce gradients, even inside ``no_sync``.

        Nothing to do for a model that is not DDP-wrapped (one process, FSDP, DeepSpeed).
        """
        if not isinstance(model, DistributedDataParallel):
            yield
            return
        old_backward, old_forward = model.require_backward_grad_sync, model.require_forward_param_sync
        model.require_backward_grad_sync = True
        model.require_forward_param_sync = True
        model.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            model.require_backward_grad_sync = old_backward
            model.require_forward_param_sync = old_forward
