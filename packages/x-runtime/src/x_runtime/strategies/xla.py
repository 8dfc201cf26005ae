"""TPU (and any torch_xla device): one replica per process, gradients averaged at the optimizer step.

What ``xm.optimizer_step`` does, split where Accelerate's API needs it: the gradients of every
replica are averaged (``xm.reduce_gradients``) once per optimizer step, before the step, or
earlier when ``clip_grad_norm_`` needs the averaged values; then the step runs and the lazy
graph is cut (``torch_xla.sync()``), so each step compiles once and runs, instead of one graph
growing over the whole epoch. There is no DDP wrapper: between steps nothing is communicated,
so ``no_sync`` has nothing to skip.

Batches reach the device through torch_xla's ``ParallelLoader`` (``strategies.xla_loader``).
Weights and optimizer state leave the device (``.cpu()``) before they are written: safetensors
cannot read XLA tensors.

torch_xla is imported only when XLA is chosen (by ``x-launch --tpu``, ``distributed_type: XLA``,
or ``PJRT_DEVICE`` in the environment): importing it takes seconds. Rank, world and device come
from ``process.xla_environment.XLAEnvironment``.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from x_runtime.core import nested
from x_runtime.core.random_state import keep_xla_rng
from x_runtime.data.gradient_state import GradientState
from x_runtime.data.loader.prepare import LoaderSpec
from x_runtime.process.topology.distributed_type import DistributedType
from x_runtime.process.topology.state import ProcessState
from x_runtime.strategies.defaults import StrategyDefaults
from x_runtime.strategies.param_moves import ParameterMoves

__all__ = ["XLAStrategy", "sync", "to_host"]


def sync() -> None:
    """Cut the lazy graph here: compile (once per shape) and run what was recorded."""
    import torch_xla

    torch_xla.sync()


def to_host(data: Any) -> Any:
    """``data`` with every tensor copied to the CPU, after running what produces them.

    Every graph cut advances the XLA random generator; a save must not, or the run that saved
    would draw other dropout masks than the same run without the save (and than its resumption).
    """
    with keep_xla_rng():
        sync()
        return nested.send_to_device(data, torch.device("cpu"))


class XLAStrategy(StrategyDefaults):
    """One replica per XLA device; gradients averaged across replicas at each optimizer step."""

    distributed_type = DistributedType.XLA
    writes_from_state_dicts = False  # tensors leave the device through XLA first

    def __init__(self, state: ProcessState, gradient_state: GradientState):
        self.state = state
        self.gradient_state = gradient_state
        # Optimizers whose gradients were averaged since their last step (clipping does it early).
        self._reduced: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self._optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self._moves = ParameterMoves()

    def place_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return self._moves.move(model, self.state.device)  # new Parameter objects on XLA, ties kept

    def wrap_model(self, model: torch.nn.Module, *, train: bool) -> torch.nn.Module:
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        self._optimizers.add(optimizer)
        return self._moves.repoint(optimizer)

    def build_loader(self, spec: LoaderSpec, device: torch.device | None, gradient_state: GradientState) -> Any:
        # Every replica reads its own share: dispatching (rank 0 reads and sends) would run its
        # collectives on CPU tensors, which the xla backend does not move, from the reader thread.
        if spec.dispatch_batches and self.state.world_size > 1:
            raise ValueError(
                "dispatch_batches=True on XLA devices: every replica reads its own share of the data here; "
                "drop dispatch_batches (iterable datasets are split the same way)"
            )
        local = spec.replace(dispatch_batches=False)
        if device is None:
            return local.build(device=None, gradient_state=gradient_state)
        from x_runtime.strategies.xla_loader import XLADeviceLoader

        # The CPU loader runs ahead in ParallelLoader's thread: it reports to a gradient state of
        # its own, and the device loader reports each batch's flags as the loop receives it.
        cpu_loader = local.build(device=None, gradient_state=GradientState())
        return XLADeviceLoader(cpu_loader, device, gradient_state)

    # --- the step ----------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, scaler: torch.amp.GradScaler | None, **kwargs: Any) -> None:
        self._reduced.clear()  # new local gradients: whatever was averaged must be averaged again
        super().backward(loss, scaler, **kwargs)

    def _average_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        if optimizer in self._reduced:
            return
        if self.state.world_size > 1:
            import torch_xla.core.xla_model as xm

            xm.reduce_gradients(optimizer)
        self._reduced.add(optimizer)

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        self._average_gradients(optimizer)

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        self._reduced.discard(optimizer)
        sync()

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor:
        # On a boundary the norm must be the averaged gradients' norm, the same on every replica.
        # Between boundaries the gradients stay local: averaged there, the micro-batches still to
        # come would add local gradients to averaged ones, and the step would not average again.
        # Averaging again what is already averaged changes nothing, so any optimizer holding one of
        # the clipped parameters is averaged (a GAN's two optimizers: each when its turn comes).
        parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        if self.gradient_state.sync_gradients:
            clipped = {id(p) for p in parameters}
            for optimizer in list(self._optimizers):
                if any(id(p) in clipped for group in optimizer.param_groups for p in group["params"]):
                    self._average_gradients(optimizer)
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    # --- weights: the DDP strategy's files, through the host -----------------------------------
    def to_host(self, data: Any) -> Any:
        return to_host(data)

    def load_device(self, model: torch.nn.Module) -> torch.device:
        return torch.device("cpu")  # safetensors cannot write into XLA tensors; load_state_dict copies
