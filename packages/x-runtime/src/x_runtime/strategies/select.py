"""Which strategy runs: plugin objects given in code first, then the launcher's choice."""

from __future__ import annotations

from typing import Any

from x_common import env
from x_runtime.data.gradient_state import GradientState
from x_runtime.process.distributed_type import DistributedType
from x_runtime.process.state import ProcessState
from x_runtime.strategies.base import Strategy
from x_runtime.strategies.ddp import DDPStrategy

__all__ = ["asked_strategy", "choose_strategy"]


def asked_strategy(fsdp_plugin: Any, deepspeed_plugin: Any) -> str | None:
    """FSDP / DEEPSPEED from the plugins or the launcher, or None.

    Raises:
        ValueError: two strategies asked at once; the message names both.
    """
    launched = env.DISTRIBUTED_TYPE.read()
    given = [name for name, plugin in (("FSDP", fsdp_plugin), ("DEEPSPEED", deepspeed_plugin)) if plugin is not None]
    if len(given) == 2:
        raise ValueError("pass fsdp_plugin or deepspeed_plugin, not both")
    if given and launched in (DistributedType.FSDP, DistributedType.DEEPSPEED) and launched != given[0]:
        raise ValueError(
            f"the launch config says distributed_type={launched} ({env.DISTRIBUTED_TYPE.name}) but the code passes "
            f"{given[0].lower()}_plugin; make them agree"
        )
    if given:
        return given[0]
    return launched if launched in (DistributedType.FSDP, DistributedType.DEEPSPEED) else None


def choose_strategy(
    state: ProcessState,
    asked: str | None,
    *,
    fsdp_plugin: Any,
    deepspeed_plugin: Any,
    mixed_precision: str,
    ddp_kwargs: dict[str, Any],
    gradient_state: GradientState | None = None,
    comm_hook: tuple[str, str, dict] | None = None,
) -> Strategy:
    """The strategy for ``asked`` (``asked_strategy``'s answer): FSDP, DeepSpeed, XLA, or DDP/plain.

    Raises:
        ValueError: a sharding plugin on XLA devices (not supported: the message says so).
    """
    if state.distributed_type == DistributedType.XLA:
        if asked is not None:
            raise ValueError(
                f"{asked} on XLA devices: x_runtime trains XLA replicas with averaged gradients only; "
                f"drop the {asked.lower()} plugin/config or train on GPUs"
            )
        from x_runtime.strategies.xla import XLAStrategy

        return XLAStrategy(state, gradient_state or GradientState())
    if asked == DistributedType.FSDP:
        from x_runtime.strategies.fsdp import FSDPStrategy
        from x_runtime.strategies.fsdp_plugin import FullyShardedDataParallelPlugin

        return FSDPStrategy(state, fsdp_plugin or FullyShardedDataParallelPlugin(), mixed_precision)
    if asked == DistributedType.DEEPSPEED:
        from x_runtime.strategies.deepspeed import DeepSpeedStrategy

        return DeepSpeedStrategy(state, deepspeed_plugin, mixed_precision)
    return DDPStrategy(state, ddp_kwargs=ddp_kwargs, comm_hook=comm_hook)
