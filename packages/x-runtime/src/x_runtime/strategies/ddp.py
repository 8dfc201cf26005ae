"""The default strategy: one process, or DistributedDataParallel over a process group.

Plain PyTorch's hooks (``defaults.StrategyDefaults``) plus the DDP wrapper when several
processes train the model, DDP's own ``no_sync``, and a communication hook registered on the
wrapper when one was asked (``DistributedDataParallelKwargs(comm_hook=...)``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from x_runtime.process.topology.state import ProcessState
from x_runtime.strategies.defaults import StrategyDefaults, check_shapes

__all__ = ["DDPStrategy", "check_shapes", "register_comm_hook"]


class DDPStrategy(StrategyDefaults):
    """Plain PyTorch: the model as it is, wrapped in DDP when several processes train it."""

    def __init__(
        self,
        state: ProcessState,
        *,
        ddp_kwargs: dict[str, Any] | None = None,
        comm_hook: tuple[str, str, dict[str, Any]] | None = None,
    ):
        self.state = state
        self.ddp_kwargs = dict(ddp_kwargs or {})
        self.comm_hook = comm_hook

    def wrap_model(self, model: torch.nn.Module, *, train: bool) -> torch.nn.Module:
        if not (train and self.state.use_distributed and any(p.requires_grad for p in model.parameters())):
            return model
        device = self.state.device
        device_ids = [device.index] if device.type in ("cuda", "xpu") else None
        wrapped = DistributedDataParallel(model, device_ids=device_ids, **self.ddp_kwargs)
        if self.comm_hook is not None:
            register_comm_hook(wrapped, *self.comm_hook)
        return wrapped

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        context = model.no_sync() if isinstance(model, DistributedDataParallel) else contextlib.nullcontext()
        with context:
            yield


def register_comm_hook(model: DistributedDataParallel, hook: str, wrapper: str, state_options: dict[str, Any]) -> None:
    """Register torch's ``hook`` ("fp16", "bf16", "power_sgd", "batched_power_sgd") on ``model``.

    ``wrapper`` ("fp16"/"bf16", or "no") compresses what the hook sends; PowerSGD hooks get a
    ``PowerSGDState`` built from ``state_options``.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    # Annotated: each hook takes (state or process group, bucket); the inferred join is a bare function.
    hooks: dict[str, Callable[[Any, torch.distributed.GradBucket], torch.futures.Future[torch.Tensor]]] = {
        "fp16": default_hooks.fp16_compress_hook,
        "bf16": default_hooks.bf16_compress_hook,
        "power_sgd": powerSGD_hook.powerSGD_hook,
        "batched_power_sgd": powerSGD_hook.batched_powerSGD_hook,
    }
    wrappers = {"fp16": default_hooks.fp16_compress_wrapper, "bf16": default_hooks.bf16_compress_wrapper}
    function = hooks[hook]
    if wrapper in wrappers:
        function = wrappers[wrapper](function)
    state = powerSGD_hook.PowerSGDState(None, **state_options) if "power_sgd" in hook else None
    model.register_comm_hook(state=state, hook=function)
