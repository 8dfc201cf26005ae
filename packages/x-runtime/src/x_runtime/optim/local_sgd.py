"""``LocalSGD``: each process takes its own optimizer steps; parameters are averaged every K steps.

Accelerate's semantics: inside ``with LocalSGD(...)`` the DDP model does not all-reduce its
gradients (``no_sync``); ``step()`` after each optimizer step averages every parameter across
processes on every ``local_sgd_steps``-th call, and leaving the block averages once more. On
one process (or ``enabled=False``) it does nothing.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from x_runtime.process.topology.distributed_type import DistributedType

__all__ = ["LocalSGD"]

_SUPPORTED = (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU, DistributedType.MULTI_XPU)


class LocalSGD:
    """Average model parameters every ``local_sgd_steps`` optimizer steps instead of every step's gradients.

    Args:
        accelerator: the ``Accelerator`` that prepared ``model``.
        model: the prepared (DDP) model.
        local_sgd_steps: optimizer steps between two averagings.
        enabled: False turns it into a no-op.

    Raises:
        NotImplementedError: under FSDP, DeepSpeed or XLA (parameters are not replicated there).

    Examples:
        >>> from x_runtime import Accelerator
        >>> accelerator = Accelerator(cpu=True)
        >>> model = accelerator.prepare(torch.nn.Linear(2, 1))
        >>> with LocalSGD(accelerator, model, local_sgd_steps=4) as local_sgd:
        ...     local_sgd.step()
        >>> local_sgd.num_steps, local_sgd.enabled
        (1, False)
    """

    def __init__(self, accelerator: Any, model: torch.nn.Module, local_sgd_steps: int, enabled: bool = True):
        if accelerator.distributed_type not in _SUPPORTED:
            raise NotImplementedError(
                f"LocalSGD averages replicated parameters: not supported under {accelerator.distributed_type} "
                "(use it with DDP on CPUs or GPUs)"
            )
        if local_sgd_steps < 1:
            raise ValueError(f"local_sgd_steps must be >= 1, got {local_sgd_steps}")
        self.enabled = bool(enabled) and accelerator.distributed_type != DistributedType.NO
        self.num_steps = 0
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self._no_sync: contextlib.AbstractContextManager | None = None

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            no_sync = getattr(self.model, "no_sync", None)
            self._no_sync = no_sync() if no_sync is not None else contextlib.nullcontext()
            self._no_sync.__enter__()
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        if self.enabled and self._no_sync is not None:
            self._average()
            self._no_sync.__exit__(kind, value, traceback)
            self._no_sync = None

    def step(self) -> None:
        """Count one optimizer step; average the parameters on every ``local_sgd_steps``-th."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._average()

    def _average(self) -> None:
        self.accelerator.wait_for_everyone()
        with torch.no_grad():
            for param in self.model.parameters():
                param.data = self.accelerator.reduce(param.data, reduction="mean")
