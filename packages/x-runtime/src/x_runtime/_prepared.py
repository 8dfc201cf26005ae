"""What one accelerator has prepared, how each object is recognised and unwrapped, and the exit hook
that releases the prepared wrappers before the process group is left.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from x_runtime.optimizer import AcceleratedOptimizer
from x_runtime.scheduler import AcceleratedScheduler
from x_runtime.state import ProcessState


class _Prepared:
    """What an accelerator has prepared; also what its exit hook releases."""

    def __init__(self) -> None:
        self.models: list[torch.nn.Module] = []
        self.optimizers: list[AcceleratedOptimizer] = []
        self.schedulers: list[AcceleratedScheduler] = []
        self.dataloaders: list[Any] = []
        self.custom: list[Any] = []

    def clear(self) -> None:
        for items in (self.models, self.optimizers, self.schedulers, self.dataloaders, self.custom):
            items.clear()


def _release_at_exit(prepared: weakref.ref[_Prepared], state: ProcessState) -> None:
    # gloo aborts some runs when a DDP reducer outlives the process group at interpreter exit:
    # drop our references and collect before leaving the group.
    held = prepared()
    if held is not None:
        held.clear()
    gc.collect()
    state.destroy()


def _kind_order(obj: Any) -> int:
    if isinstance(obj, torch.nn.Module):
        return 0
    if isinstance(obj, torch.optim.Optimizer):
        return 1
    if isinstance(obj, torch.utils.data.DataLoader):
        return 2
    return 3


def _is_scheduler(obj: Any) -> bool:
    return isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or (
        hasattr(obj, "step") and hasattr(obj, "optimizer") and hasattr(obj, "state_dict")
    )


def _unwrap(model: Any, *, keep_torch_compile: bool = False, through_ddp: bool = True) -> Any:
    compiled = model if hasattr(model, "_orig_mod") else None
    if compiled is not None:
        model = compiled._orig_mod
    if type(model).__name__ == "DeepSpeedEngine":
        return model.module
    if isinstance(model, DistributedDataParallel):
        if not through_ddp:
            return model
        # A compiled DDP wrapper cannot be kept without the DDP inside it: return the model.
        return _unwrap(model.module, keep_torch_compile=keep_torch_compile)
    return compiled if keep_torch_compile and compiled is not None else model


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _leaves(data: Any) -> list[Any]:
    if isinstance(data, (list, tuple)):
        return [leaf for item in data for leaf in _leaves(item)]
    if isinstance(data, dict):
        return [leaf for item in data.values() for leaf in _leaves(item)]
    return [data]
