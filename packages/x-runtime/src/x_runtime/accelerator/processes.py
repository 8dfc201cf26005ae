"""The ``Accelerator``'s methods over processes: collectives and running code on chosen ranks.

A mixin of the facade: each method forwards to ``collectives`` or ``helpers`` with the
accelerator's ``ProcessState`` (and, for ``gather_for_metrics``, its gradient state).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from x_runtime.accelerator.fields import AcceleratorFields
from x_runtime.core import nested
from x_runtime.process import collectives
from x_runtime.process.operations import progress
from x_runtime.process.operations.on_ranks import first_on, on_process, split_between_processes

__all__ = ["ProcessMethods"]


class ProcessMethods(AcceleratorFields):
    """Accelerate's process and collective methods, over ``self.process_state``."""

    # --- collectives -----------------------------------------------------------------------
    # Under tensor parallelism the ranks of one group hold the same batch and the same outputs. For
    # metrics only the group's first rank contributes rows (the others an empty slice), so every
    # sample is counted once; Accelerate returns each tp_size times. ``gather`` and ``reduce`` keep
    # Accelerate's meaning, every rank's data: libraries index their results by process
    # (TRL's GRPO) or divide by tp_size themselves (transformers' Trainer counting tokens).
    def _own_rows(self, data: Any) -> Any:
        if not self.layout.duplicates_batches or self.layout.speaks_for_batch:
            return data
        return nested.apply(lambda t: t.reshape(-1, *t.shape[1:])[:0] if t.dim() else t.reshape(1)[:0], data)

    def gather(self, tensor: Any) -> Any:
        """Every process's tensors concatenated along dim 0 (nested structures kept), tensor parallel ranks included."""
        with progress.during(progress.Phase.GATHER):
            return collectives.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """``gather`` minus the samples duplicated to even out the last batch, and each sample once under TP.

        Over a whole epoch the gathered results hold exactly ``len(dataset)`` samples, in order.
        Non-tensor data (or ``use_gather_object=True``) goes through ``gather_object``.
        """
        tensors_only = all(isinstance(t, torch.Tensor) for t in _leaves(input_data))
        if use_gather_object or not tensors_only:
            own = self.layout.speaks_for_batch or not self.layout.duplicates_batches
            with progress.during(progress.Phase.GATHER_OBJECT):
                data = collectives.gather_object(input_data if own else [])
        else:
            with progress.during(progress.Phase.GATHER):
                data = collectives.gather(self._own_rows(input_data))
        state = self.gradient_state
        if not state.end_of_dataloader or state.remainder < 0:
            return data
        if use_gather_object or not tensors_only:
            return data[: state.remainder]
        return nested.slice_batch(data, slice(0, state.remainder))

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
        with progress.during(progress.Phase.PAD):
            return collectives.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        with progress.during(progress.Phase.REDUCE):
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
        return (
            self.process_state.device if self.process_state.backend in ("nccl", "xccl", "xla") else torch.device("cpu")
        )

    # --- processes -------------------------------------------------------------------------
    def wait_for_everyone(self) -> None:
        with progress.during(progress.Phase.BARRIER):
            self.process_state.wait_for_everyone()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the local main process only."""
        if self.process_state.is_local_main_process:
            print(*args, **kwargs)

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        return first_on(self.process_state, self.process_state.is_main_process)

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        return first_on(self.process_state, self.process_state.is_local_main_process)

    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return on_process(self.process_state, lambda s: s.is_main_process)(function)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return on_process(self.process_state, lambda s: s.is_local_main_process)(function)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return on_process(self.process_state, lambda s: s.is_last_process)(function)

    def on_process(self, function: Callable[..., Any] | None = None, process_index: int | None = None) -> Any:
        if process_index is None:
            raise ValueError("on_process needs process_index, e.g. @accelerator.on_process(process_index=1)")
        decorate = on_process(self.process_state, lambda s: s.rank == process_index)
        return decorate if function is None else decorate(function)

    def on_local_process(
        self, function: Callable[..., Any] | None = None, local_process_index: int | None = None
    ) -> Any:
        if local_process_index is None:
            raise ValueError("on_local_process needs local_process_index")
        decorate = on_process(self.process_state, lambda s: s.local_rank == local_process_index)
        return decorate if function is None else decorate(function)

    def split_between_processes(
        self, inputs: Any, apply_padding: bool = False
    ) -> contextlib.AbstractContextManager[Any]:
        return split_between_processes(self.process_state, inputs, apply_padding=apply_padding)


def _leaves(data: Any) -> list[Any]:
    if isinstance(data, (list, tuple)):
        return [leaf for item in data for leaf in _leaves(item)]
    if isinstance(data, dict):
        return [leaf for item in data.values() for leaf in _leaves(item)]
    return [data]
