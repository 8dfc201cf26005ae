"""Which strategy runs and how the process group is joined, decided in one place.

``decide`` reads the plugins given in code, the code's process-group options and the launcher's
``distributed_type`` once, and returns a ``StrategyChoice``. Everything else reads that answer: the
``Accelerator`` (``choice.join`` then ``choice.build``), and ``PartialState``/``AcceleratorState``
built on their own (``choice.join``), so the three always agree on the strategy, the group's
backend and whether a world of one joins a group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from x_common import env
from x_runtime.core.settings import Settings, current_settings
from x_runtime.data.gradient_state import GradientState
from x_runtime.process.topology.distributed_type import SHARDED, DistributedType
from x_runtime.process.topology.environment_contract import GroupOptions
from x_runtime.process.topology.state import ProcessState
from x_runtime.strategies.base import Strategy
from x_runtime.strategies.ddp import DDPStrategy
from x_runtime.strategies.fsdp_plugin import needs_cpu_collectives

__all__ = ["StrategyChoice", "decide"]


@dataclass(frozen=True)
class StrategyChoice:
    """The answer of ``decide``: the sharding strategy asked for (or None) and the group options it needs."""

    kind: str | None  # DistributedType.FSDP or DEEPSPEED; None: the environment's (DDP, one process, XLA)
    group: GroupOptions
    fsdp_plugin: Any = None
    deepspeed_plugin: Any = None
    settings: Settings = field(default_factory=current_settings, repr=False)  # the launcher's, read once

    def join(self, *, cpu: bool = False, partial: bool = False) -> ProcessState:
        """This process placed by its environment, in the process group the strategy needs.

        Its ``distributed_type`` names the sharding strategy when one runs (XLA stays XLA: ``build``
        refuses a sharding strategy there), unless ``partial``: Accelerate's ``PartialState`` reports
        the environment's own type (MULTI_GPU under an FSDP launch), only ``AcceleratorState`` FSDP.
        """
        process = ProcessState.from_environment(cpu=cpu, group=self.group, environ=self.settings.environ)
        if self.kind is not None and not partial and process.distributed_type != DistributedType.XLA:
            process.distributed_type = self.kind
        return process

    def build(
        self,
        process: ProcessState,
        *,
        mixed_precision: str,
        ddp_kwargs: dict[str, Any] | None = None,
        gradient_state: GradientState | None = None,
        comm_hook: tuple[str, str, dict[str, Any]] | None = None,
    ) -> Strategy:
        """The strategy object: FSDP, DeepSpeed, XLA, or DDP (also one process).

        Raises:
            ValueError: a sharding plugin on XLA devices (not supported: the message says so).
        """
        if process.distributed_type == DistributedType.XLA:
            if self.kind is not None:
                raise ValueError(
                    f"{self.kind} on XLA devices: x_runtime trains XLA replicas with averaged gradients only; "
                    f"drop the {self.kind.lower()} plugin/config or train on GPUs"
                )
            from x_runtime.strategies.xla import XLAStrategy

            return XLAStrategy(process, gradient_state or GradientState())
        if self.kind == DistributedType.FSDP:
            from x_runtime.strategies.fsdp import FSDPStrategy
            from x_runtime.strategies.fsdp_plugin import FullyShardedDataParallelPlugin

            return FSDPStrategy(process, self.fsdp_plugin or FullyShardedDataParallelPlugin(), mixed_precision)
        if self.kind == DistributedType.DEEPSPEED:
            from x_runtime.strategies.deepspeed import DeepSpeedStrategy

            return DeepSpeedStrategy(process, self.deepspeed_plugin, mixed_precision, gradient_state)
        return DDPStrategy(process, ddp_kwargs=ddp_kwargs or {}, comm_hook=comm_hook)


def decide(
    *,
    fsdp_plugin: Any = None,
    deepspeed_plugin: Any = None,
    backend: str | None = None,
    init_method: str | None = None,
    timeout: timedelta | None = None,
    settings: Settings | None = None,
) -> StrategyChoice:
    """The strategy from the plugins given in code, else the launcher's ``distributed_type``; its group options.

    Examples:
        >>> decide(settings=Settings.of({})).kind is None
        True
        >>> decide(settings=Settings.of({env.DISTRIBUTED_TYPE.name: "FSDP"})).group.sharded
        True

    Raises:
        ValueError: both plugins given, or a plugin that contradicts the launcher's choice; the
            message names both.
    """
    settings = settings or current_settings()
    launched = settings.get(env.DISTRIBUTED_TYPE)
    given = [name for name, plugin in (("FSDP", fsdp_plugin), ("DEEPSPEED", deepspeed_plugin)) if plugin is not None]
    if len(given) == 2:
        raise ValueError("pass fsdp_plugin or deepspeed_plugin, not both")
    if given and launched in SHARDED and launched != given[0]:
        raise ValueError(
            f"the launch config says distributed_type={launched} ({env.DISTRIBUTED_TYPE.name}) but the code passes "
            f"{given[0].lower()}_plugin; make them agree"
        )
    kind = given[0] if given else (launched if launched in SHARDED else None)
    group = GroupOptions(
        backend=backend,
        init_method=init_method,
        timeout=timeout,
        sharded=kind is not None,
        cpu_collectives=kind == DistributedType.FSDP and needs_cpu_collectives(fsdp_plugin, settings),
    )
    return StrategyChoice(kind, group, fsdp_plugin=fsdp_plugin, deepspeed_plugin=deepspeed_plugin, settings=settings)
