"""The default strategy: one process, or DistributedDataParallel over a process group.

Plain PyTorch's hooks (``defaults.StrategyDefaults``) plus the DDP wrapper when several
processes train the model, and DDP's own ``no_sync``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from x_runtime.process.state import ProcessState
from x_runtime.strategies.defaults import StrategyDefaults, check_shapes

__all__ = ["DDPStrategy", "check_shapes"]


class DDPStrategy(StrategyDefaults):
    """Plain PyTorch: the model as it is, wrapped in DDP when several processes train it."""

    def __init__(self, state: ProcessState, *, ddp_kwargs: dict[str, Any] | None = None):
        self.state = state
        self.ddp_kwargs = dict(ddp_kwargs or {})

    def wrap_model(self, model: torch.nn.Module, *, train: bool) -> torch.nn.Module:
        if not (train and self.state.use_distributed and any(p.requires_grad for p in model.parameters())):
            return model
        device = self.state.device
        device_ids = [device.index] if device.type in ("cuda", "xpu") else None
        return DistributedDataParallel(model, device_ids=device_ids, **self.ddp_kwargs)

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        context = model.no_sync() if isinstance(model, DistributedDataParallel) else contextlib.nullcontext()
        with context:
            yield
