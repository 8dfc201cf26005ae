"""What ``Accelerator(parallelism_config=...)`` accepts: the layouts x trains, refused otherwise.

x trains data parallel only: DDP (every rank a replica) or FSDP over every rank. Accelerate also
composes tensor, context and sequence parallelism and HSDP on a device mesh; x does not yet, and a
configuration asking for them fails here, in one line, rather than training another layout than
the one written. What x does train is written back into the configuration (as Accelerate does for
an all-ones configuration), so ``accelerator.parallelism_config`` describes the run.
"""

from __future__ import annotations

from x_runtime.core.parallelism import ParallelismConfig
from x_runtime.process.topology.distributed_type import DistributedType

__all__ = ["check_parallelism"]


def check_parallelism(
    config: ParallelismConfig | None, *, num_processes: int, distributed_type: str | None
) -> ParallelismConfig | None:
    """``config``, checked against the world and the strategy, with the data parallel size filled in.

    ``distributed_type`` is the strategy's kind (``DistributedType.FSDP``, ``DEEPSPEED``), or ``None``
    for the environment's own (DDP, one process, XLA).

    Raises:
        TypeError: ``config`` is not a ``ParallelismConfig``.
        ValueError: a dimension x does not train (tp, cp, sp, HSDP), sizes whose product is not
            the number of processes, or a layout the strategy cannot give (FSDP needs every rank
            in ``dp_shard``).

    Examples:
        >>> config = check_parallelism(ParallelismConfig(), num_processes=4, distributed_type=DistributedType.MULTI_GPU)
        >>> config.dp_replicate_size, config.total_size
        (4, 4)
    """
    if config is None:
        return None
    if not isinstance(config, ParallelismConfig):
        raise TypeError(f"parallelism_config must be a ParallelismConfig, got {type(config).__name__}")
    fsdp = distributed_type == DistributedType.FSDP
    unsupported = [f"{dim}_size={getattr(config, f'{dim}_size')}" for dim in config.non_dp_dim_names]
    if fsdp and config.dp_replicate_enabled:
        unsupported.append(f"HSDP (dp_replicate_size={config.dp_replicate_size} under FSDP)")
    if unsupported:
        raise ValueError(
            f"parallelism_config: x trains data parallel layouts only (DDP, FSDP over every rank), not "
            f"{', '.join(unsupported)}"
        )
    if config.total_size == 1 and num_processes > 1:
        # Every rank in the one dimension the strategy uses, as the run will be.
        if fsdp:
            config.dp_shard_size = num_processes
        else:
            config.dp_replicate_size = num_processes
    if config.total_size != num_processes:
        raise ValueError(
            f"parallelism_config: total_size {config.total_size} (dp_replicate_size={config.dp_replicate_size} x "
            f"dp_shard_size={config.dp_shard_size}) does not match num_processes {num_processes}"
        )
    return config
