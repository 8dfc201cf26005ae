"""The prepared optimizer: steps only on accumulation boundaries, through the scaler under fp16.

Between boundaries ``step`` and ``zero_grad`` do nothing, so a loop written for one step per
batch accumulates without changes. Under fp16 a step whose gradients overflowed is skipped by
the scaler; ``step_was_skipped`` says so (the scheduler then does not advance either).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from x_runtime.core import nested
from x_runtime.data.gradient_state import GradientState
from x_runtime.process.operations import progress

__all__ = ["AcceleratedOptimizer"]


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps a torch optimizer; attribute access falls through to it."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        gradient_state: GradientState,
        scaler: torch.amp.GradScaler | None = None,
        device: torch.device | None = None,
        before_step: Callable[[torch.optim.Optimizer], None] | None = None,
        after_step: Callable[[torch.optim.Optimizer], None] | None = None,
    ):
        # Not calling Optimizer.__init__: the wrapped optimizer owns param_groups and state.
        self.optimizer = optimizer
        self.gradient_state = gradient_state
        self.scaler = scaler
        self._is_overflow = False  # Accelerate's name for it, which code written for Accelerate sets
        self._unscaled = False
        self.steps_in_backward = False  # DeepSpeed: the engine steps and zeroes inside backward
        # The strategy's part of a step (XLA: average gradients across replicas, then cut the graph).
        self._before_step = before_step
        self._after_step = after_step
        if device is not None and optimizer.state:
            # Optimizer state created before prepare lives where the model was; move it along.
            optimizer.load_state_dict(nested.send_to_device(optimizer.state_dict(), device))

    @property
    def state(self) -> Any:
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.gradient_state.sync_gradients and not self.steps_in_backward:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def unscale(self) -> None:
        """Divide gradients by the loss scale once per step (clipping needs true values).

        Raises:
            RuntimeError: on a step that accumulates gradients (``sync_gradients`` false) under a
                loss scaler: the next backward would add scaled gradients to unscaled ones.
        """
        if self.scaler is not None and not self._unscaled:
            if not self.gradient_state.sync_gradients:
                # Accelerate fails here too, one micro-step later, with torch's "unscale_() has
                # already been called"; said now, and before any gradient is mixed.
                raise RuntimeError(
                    "gradients unscaled (clip_grad_norm_, clip_grad_value_ or unscale_gradients) on a step that "
                    "accumulates them under fp16: clip only when accelerator.sync_gradients is True"
                )
            self.scaler.unscale_(self.optimizer)
            self._unscaled = True

    def step(self, closure: Any = None) -> Any:
        if not self.gradient_state.sync_gradients or self.steps_in_backward:
            return None
        if self._before_step is not None:
            self._before_step(self.optimizer)
        result = self._step(closure)
        if self._after_step is not None:
            self._after_step(self.optimizer)
        progress.step_done()  # x-launch's stall watchdog and straggler report count it
        return result

    def _step(self, closure: Any) -> Any:
        self._unscaled = False
        if self.scaler is None:
            self._is_overflow = False
            return self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        scale_before = self.scaler.get_scale()
        result = self.scaler.step(self.optimizer, closure) if closure is not None else self.scaler.step(self.optimizer)
        self.scaler.update()
        # The scaler lowers its scale exactly when it skipped the step for inf/nan gradients.
        self._is_overflow = self.scaler.get_scale() < scale_before
        return result

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last boundary's step was skipped for overflowing fp16 gradients."""
        if self.steps_in_backward:
            # DeepSpeed scales the loss itself and skips the step inside backward on overflow.
            return bool(getattr(self.optimizer, "overflow", False))
        return self._is_overflow

    def train(self) -> None:
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()

    def eval(self) -> None:
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not found normally: fall through to the wrapped optimizer.
        if name == "optimizer":
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def __getstate__(self) -> dict[str, Any]:
        # The strategy hooks stay behind: they are bound to the accelerator's strategy, which
        # holds weak references (neither picklable nor meaningful in a copy).
        return {k: v for k, v in self.__dict__.items() if k not in ("_before_step", "_after_step")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"_before_step": None, "_after_step": None, **state})

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"
