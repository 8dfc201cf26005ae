"""What one accelerator has prepared, how each object is recognised, and the exit hook that releases
the prepared wrappers before the process group is left.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import torch

from x_runtime.optim.optimizer import AcceleratedOptimizer
from x_runtime.optim.scheduler import AcceleratedScheduler
from x_runtime.process.state import ProcessState

__all__ = ["PreparedObjects", "is_scheduler", "kind_order", "release_at_exit"]


class PreparedObjects:
    """What an accelerator has prepared; also what its exit hook releases."""

    def __init__(self) -> None:
        self.models: list[torch.nn.Module] = []
        self.optimizers: list[AcceleratedOptimizer] = []
        self.schedulers: list[AcceleratedScheduler] = []
        self.dataloaders: list[Any] = []
        self.custom: list[Any] = []

    def holds(self, obj: Any) -> bool:
        """Whether ``obj`` itself is one of the prepared objects."""
        kinds = (self.models, self.optimizers, self.schedulers, self.dataloaders)
        return any(obj is item for items in kinds for item in items)

    def clear(self) -> None:
        for items in (self.models, self.optimizers, self.schedulers, self.dataloaders, self.custom):
            items.clear()


def release_at_exit(prepared: weakref.ref[PreparedObjects], state: ProcessState) -> None:
    # gloo aborts some runs when a DDP reducer outlives the process group at interpreter exit:
    # drop our references and collect before leaving the group.
    held = prepared()
    if held is not None:
        held.clear()
    gc.collect()
    state.destroy()


def kind_order(obj: Any) -> int:
    if isinstance(obj, torch.nn.Module):
        return 0
    if isinstance(obj, torch.optim.Optimizer):
        return 1
    if isinstance(obj, torch.utils.data.DataLoader):
        return 2
    return 3


def is_scheduler(obj: Any) -> bool:
    return isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or (
        hasattr(obj, "step") and hasattr(obj, "optimizer") and hasattr(obj, "state_dict")
    )
