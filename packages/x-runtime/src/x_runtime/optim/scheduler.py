"""The prepared learning-rate scheduler, stepped in line with the optimizer.

It advances only when the optimizer really stepped (an accumulation boundary, and not an fp16
overflow skip). Without ``split_batches`` each of N processes sees 1/N of the data per step,
so one step covers N single-process steps' worth of samples and the scheduler advances N times:
a schedule written for the single-process length then ends when training ends (Accelerate does
the same).
"""

from __future__ import annotations

from typing import Any

from x_runtime.data.gradient_state import GradientState
from x_runtime.optim.optimizer import AcceleratedOptimizer

__all__ = ["AcceleratedScheduler"]


class AcceleratedScheduler:
    """Wraps a torch LR scheduler; attribute access falls through to it."""

    def __init__(
        self,
        scheduler: Any,
        optimizers: list[AcceleratedOptimizer],
        *,
        gradient_state: GradientState,
        step_with_optimizer: bool = True,
        split_batches: bool = False,
        num_processes: int = 1,
    ):
        self.scheduler = scheduler
        self.optimizers = optimizers
        self.gradient_state = gradient_state
        self.step_with_optimizer = step_with_optimizer
        self.split_batches = split_batches
        self.num_processes = num_processes

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            if self.gradient_state.adjust_scheduler:
                self.scheduler._step_count += 1
            return
        if any(opt.step_was_skipped for opt in self.optimizers):
            return
        # adjust_scheduler changes only the count of micro-batches above, as in Accelerate: the N
        # steps per step below stand whatever it says.
        if self.split_batches:
            self.scheduler.step(*args, **kwargs)
            return
        total = getattr(self.scheduler, "total_steps", None)
        for _ in range(self.num_processes):
            # OneCycleLR raises past its total; stop there instead.
            if total is not None and self.scheduler.last_epoch >= total:
                break
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def get_lr(self) -> Any:
        return self.scheduler.get_lr()

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)
