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
or ``PJRT_DEVICE`` in the environment): importing it takes seconds.
"""

from __future__ import annotations

import importlib
import weakref
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from x_runtime import nested
from x_runtime.gradient_state import GradientState
from x_runtime.random_state import keep_xla_rng
from x_runtime.state import DistributedType, ProcessState
from x_runtime.strategies.ddp import DDPStrategy
from x_runtime.strategies.param_moves import ParameterMoves

__all__ = ["XLAStrategy", "import_torch_xla", "xla_process_state"]

INSTALL_HINT = (
    "pip install 'x-runtime[tpu]' on a TPU VM, or pip install torch_xla==<your torch version> "
    "(torch_xla is released for one torch version at a time)"
)


def import_torch_xla() -> Any:
    """``torch_xla``, or a ValueError saying how to install it."""
    try:
        torch_xla = importlib.import_module("torch_xla")
        # xla_model: collectives, RNG, rendezvous; xla_backend registers the "xla" process group.
        for part in ("core.xla_model", "runtime", "distributed.xla_backend"):
            importlib.import_module(f"torch_xla.{part}")
    except ImportError as exc:
        raise ValueError(
            f"distributed_type XLA needs torch_xla, which is not importable ({exc}): {INSTALL_HINT}"
        ) from exc
    return torch_xla


def xla_process_state(
    *, init_method: str | None, timeout: timedelta, backend: str | None, cpu: bool, source_flag: str
) -> ProcessState:
    """This process's replica: rank and world from the XLA runtime, the ``xla`` process group joined.

    Raises:
        ValueError: torch_xla is missing, or XLA was asked together with ``cpu=True`` or
            another backend.
    """
    if cpu:
        raise ValueError(f"{source_flag} asks for an XLA device but cpu=True was passed: drop one of them")
    if backend not in (None, "xla"):
        raise ValueError(f"{source_flag}: XLA replicas talk through the 'xla' backend, not {backend!r}")
    torch_xla = import_torch_xla()
    init_method = init_method or "xla://"
    joined = False
    if dist.is_torchelastic_launched() and not dist.is_initialized():
        # Under torchrun, torch_xla binds each process to its own device inside the xla://
        # rendezvous: asking the runtime anything first would open every device in every process.
        dist.init_process_group(backend="xla", init_method=init_method, timeout=timeout)
        joined = True
    runtime = torch_xla.runtime
    devices = runtime.addressable_device_count()
    if devices > 1:
        raise ValueError(
            f"this process drives {devices} XLA devices (TPU v2/v3 hosts, or CPU_NUM_DEVICES/GPU_NUM_DEVICES > 1); "
            "x_runtime runs one replica per process and device: start one process per device "
            "(x-launch --tpu does) on TPU v4 or newer"
        )
    world, rank = runtime.world_size(), runtime.global_ordinal()
    local_world = max(1, runtime.local_process_count())
    state = ProcessState(
        rank=rank,
        local_rank=runtime.local_ordinal(),
        world_size=world,
        local_world_size=local_world,
        node_rank=rank // local_world,
        device=torch_xla.device(),
        backend="xla",
        distributed_type=DistributedType.XLA,
        source="xla",
    )
    if joined:
        state.owns_process_group = True
    elif not state._adopt_existing_group():
        _join(state, init_method, timeout)
    # The XLA generator does not follow torch.manual_seed; starting it from torch's seed carries a
    # set_seed() made before the accelerator existed (or torch's own random seed) to the device.
    torch_xla.core.xla_model.set_rng_state(torch.initial_seed())
    return state


def _join(state: ProcessState, init_method: str, timeout: timedelta) -> None:
    """The xla process group; a world of one joins too, so collectives take the pod's path."""
    if state.world_size == 1:
        # xla:// would bind MASTER_PORT (12355 by default) for a store nobody else reads.
        dist.init_process_group(backend="xla", store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    elif init_method == "xla://":  # its rendezvous takes rank and world from the XLA runtime
        dist.init_process_group(backend="xla", init_method=init_method, timeout=timeout)
    else:
        dist.init_process_group(
            backend="xla", init_method=init_method, rank=state.rank, world_size=state.world_size, timeout=timeout
        )
    state.owns_process_group = True


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


class XLAStrategy(DDPStrategy):
    """One replica per XLA device; gradients averaged across replicas at each optimizer step."""

    distributed_type = DistributedType.XLA

    def __init__(self, state: ProcessState, gradient_state: GradientState):
        super().__init__(state)
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

    def build_loader(self, build: Any, device: torch.device | None, gradient_state: Any) -> Any:
        # Every replica reads its own share: dispatching (rank 0 reads and sends) would run its
        # collectives on CPU tensors, which the xla backend does not move, from the reader thread.
        if getattr(build, "keywords", {}).get("dispatch_batches") and self.state.world_size > 1:
            raise ValueError(
                "dispatch_batches=True on XLA devices: every replica reads its own share of the data here; "
                "drop dispatch_batches (iterable datasets are split the same way)"
            )
        if device is None:
            return build(device=None, gradient_state=gradient_state, dispatch_batches=False)
        from x_runtime.strategies.xla_loader import XLADeviceLoader

        # The CPU loader runs ahead in ParallelLoader's thread: it reports to a gradient state of
        # its own, and the device loader reports each batch's flags as the loop receives it.
        cpu_loader = build(device=None, gradient_state=GradientState(), dispatch_batches=False)
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
