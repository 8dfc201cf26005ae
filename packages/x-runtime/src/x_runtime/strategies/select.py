"""Which strategy runs, on which layout, and how the process group is joined, decided in one place.

``decide`` reads the plugins given in code, the code's ``ParallelismConfig`` (or the launcher's
``PARALLELISM_CONFIG_*`` variables), the code's process-group options and the launcher's
``distributed_type`` once, and returns a ``StrategyChoice``. Everything else reads that answer: the
``Accelerator`` (``choice.join``, ``choice.layout``, then ``choice.build``), and
``PartialState``/``AcceleratorState`` built on their own (``choice.join``), so they always agree on
the strategy, the layout, the group's backend and whether a world of one joins a group.

The layout picks the strategy when the plugins do not: ranks that shard (``dp_shard_size`` or
``cp_size`` above one) train under FSDP2 (HSDP with ``dp_replicate_size`` too), tensor parallel
ranks alone split the model's layers without FSDP, replicas alone train under DDP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from x_common import env
from x_runtime.core.parallelism import ParallelismConfig
from x_runtime.core.settings import Settings, building, current_settings
from x_runtime.data.gradient_state import GradientState
from x_runtime.process.topology.distributed_type import SHARDED, DistributedType
from x_runtime.process.topology.environment_contract import GroupOptions
from x_runtime.process.topology.state import ProcessState
from x_runtime.strategies.base import Strategy
from x_runtime.strategies.ddp import DDPStrategy
from x_runtime.strategies.fsdp_plugin import needs_cpu_collectives
from x_runtime.strategies.layout import BadLayoutError, Layout

__all__ = ["StrategyChoice", "decide"]


@dataclass(frozen=True)
class StrategyChoice:
    """The answer of ``decide``: the sharding strategy asked for (or None) and the group options it needs."""

    kind: str | None  # DistributedType.FSDP or DEEPSPEED; None: the environment's (DDP, one process, XLA)
    group: GroupOptions
    fsdp_plugin: Any = None
    deepspeed_plugin: Any = None
    settings: Settings = field(default_factory=current_settings, repr=False)  # the launcher's, read once
    parallelism: ParallelismConfig | None = None  # the layout asked for; sizes filled in by ``layout``

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

    def layout(self, process: ProcessState) -> Layout:
        """The run's layout over the joined group: the sizes checked against the world, the one mesh built.

        A configuration of all ones (``ParallelismConfig()``) spans the world in the dimension the
        strategy uses, as Accelerate fills it: ``dp_shard`` under FSDP, ``dp_replicate`` otherwise.
        FSDP without a configuration gets one too (``dp_shard`` over every rank): its mesh is the
        run's mesh, not one of its own.

        Raises:
            ValueError: the sizes' product is not the number of processes.
        """
        config = self.parallelism
        fsdp = self.kind == DistributedType.FSDP
        if config is None and fsdp:
            config = ParallelismConfig(dp_replicate_size=1, dp_shard_size=process.world_size, tp_size=1, cp_size=1)
        if config is not None and config.total_size == 1 and process.world_size > 1:
            if fsdp:
                config.dp_shard_size = process.world_size
            else:
                config.dp_replicate_size = process.world_size
        return Layout.build(
            config, rank=process.rank, world_size=process.world_size, device_type=process.device.type, fsdp=fsdp
        )

    def build(
        self,
        process: ProcessState,
        *,
        mixed_precision: str,
        ddp_kwargs: dict[str, Any] | None = None,
        gradient_state: GradientState | None = None,
        comm_hook: tuple[str, str, dict[str, Any]] | None = None,
        layout: Layout | None = None,
    ) -> Strategy:
        """The strategy object: FSDP (HSDP), tensor parallel, DeepSpeed, XLA, or DDP (also one process).

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

            plugin = self.fsdp_plugin or FullyShardedDataParallelPlugin()
            return FSDPStrategy(process, plugin, mixed_precision, layout or self.layout(process))
        if self.kind == DistributedType.DEEPSPEED:
            from x_runtime.strategies.deepspeed import DeepSpeedStrategy

            return DeepSpeedStrategy(process, self.deepspeed_plugin, mixed_precision, gradient_state)
        if self.parallelism is not None and self.parallelism.tp_enabled:
            from x_runtime.strategies.tensor_parallel import TensorParallelStrategy

            return TensorParallelStrategy(process, mixed_precision, layout or self.layout(process))
        return DDPStrategy(process, ddp_kwargs=ddp_kwargs or {}, comm_hook=comm_hook)


def decide(
    *,
    fsdp_plugin: Any = None,
    deepspeed_plugin: Any = None,
    backend: str | None = None,
    init_method: str | None = None,
    timeout: timedelta | None = None,
    settings: Settings | None = None,
    parallelism_config: ParallelismConfig | None = None,
) -> StrategyChoice:
    """The strategy from the plugins given in code, else the launcher's ``distributed_type``, else the layout.

    ``parallelism_config`` is the code's; without one, the launcher's ``PARALLELISM_CONFIG_*``
    sizes are read when it said ``ACCELERATE_USE_PARALLELISM_CONFIG`` (``--use_parallelism_config``).

    Examples:
        >>> decide(settings=Settings.of({})).kind is None
        True
        >>> decide(settings=Settings.of({env.DISTRIBUTED_TYPE.name: "FSDP"})).group.sharded
        True

    Raises:
        ValueError: both plugins given, or a plugin that contradicts the launcher's choice; the
            message names both. A layout x does not train (sequence parallelism; tensor, context or
            sharded data parallelism under DeepSpeed; FSDP over no shards): one line naming what runs.
        TypeError: ``parallelism_config`` is not a ``ParallelismConfig``.
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
    config = _layout_config(parallelism_config, settings)
    if config is not None:
        kind = _kind_for_layout(config, kind, from_code=bool(given))
    group = GroupOptions(
        backend=backend,
        init_method=init_method,
        timeout=timeout,
        sharded=kind is not None,
        cpu_collectives=kind == DistributedType.FSDP and needs_cpu_collectives(fsdp_plugin, settings),
    )
    return StrategyChoice(
        kind, group, fsdp_plugin=fsdp_plugin, deepspeed_plugin=deepspeed_plugin, settings=settings, parallelism=config
    )


def _layout_config(config: ParallelismConfig | None, settings: Settings) -> ParallelismConfig | None:
    if config is None and settings.get(env.USE_PARALLELISM_CONFIG):
        with building(settings):
            config = ParallelismConfig()
    if config is not None and not isinstance(config, ParallelismConfig):
        raise TypeError(f"parallelism_config must be a ParallelismConfig, got {type(config).__name__}")
    return config


def _kind_for_layout(config: ParallelismConfig, kind: str | None, *, from_code: bool) -> str | None:
    """The strategy the layout needs, given the one the plugins or the launcher chose (``kind``)."""
    if config.sp_enabled:
        raise BadLayoutError(
            f"parallelism_config: x does not train sequence parallelism (sp_size={config.sp_size}, DeepSpeed "
            "Ulysses); for long sequences use cp_size on GPUs (context parallelism over FSDP2), or tp_size"
        )
    model_split = config.tp_enabled or config.cp_enabled or config.dp_shard_enabled
    if kind == DistributedType.DEEPSPEED:
        if model_split:
            raise BadLayoutError(
                f"parallelism_config: DeepSpeed trains data parallel replicas only here (got {_sizes(config)}); "
                "drop the DeepSpeed plugin/config to train this layout under FSDP2, or keep DeepSpeed with ZeRO stages"
            )
        return kind
    if config.dp_shard_enabled or config.cp_enabled:
        return DistributedType.FSDP
    if kind == DistributedType.FSDP and config.tp_enabled and not from_code:
        # Accelerate's launcher asks for FSDP2 with any ParallelismConfig: tensor parallel alone has nothing to shard.
        return None
    if kind == DistributedType.FSDP and config.total_size > 1:
        raise BadLayoutError(
            f"parallelism_config: FSDP shards over dp_shard_size, which is 1 ({_sizes(config)}); set dp_shard_size "
            "(with dp_replicate_size for HSDP), or drop the FSDP plugin/config to train replicas or tensor parallel alone"
        )
    return kind


def _sizes(config: ParallelismConfig) -> str:
    return ", ".join(f"{dim}_size={config.size(dim)}" for dim in ("dp_replicate", "dp_shard", "tp", "cp", "sp"))
