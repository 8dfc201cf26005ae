"""Joining torch's default process group, or adopting the one the script (or another accelerator) made."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from x_runtime.process.topology.exit_settle import settle_collectives_at_exit

__all__ = ["join_group"]


def join_group(
    *,
    backend: str | None,
    timeout: timedelta,
    rank: int | None = None,
    world_size: int | None = None,
    init_method: str | Callable[[], str | None] | None = None,
    device: torch.device | None = None,
    in_process: bool = False,
    assign_ranks: bool = True,
) -> bool:
    """Join torch's default process group, or adopt the one that exists; True when this call created it.

    Args:
        backend: the group's backend.
        timeout: bounds every collective of the group.
        rank: this process's rank; an existing group must agree. ``None`` (under torchrun on XLA):
            the rendezvous assigns it.
        world_size: the number of processes; an existing group must agree (``None`` as for rank).
        init_method: the rendezvous, or a function giving it (asked only when a group is created).
        device: a CUDA device becomes the current one before the group is created.
        in_process: a world of one through an in-process store: no rendezvous, no port to find.
        assign_ranks: pass ``rank``/``world_size`` to ``init_process_group`` (``xla://`` takes them
            from the XLA runtime instead).

    Raises:
        RuntimeError: a group exists whose rank or world size disagree with ``rank``/``world_size``.
    """
    settle_collectives_at_exit()  # a group adopted or created alike: its threads outlive the script
    if dist.is_initialized():
        if rank is not None and (dist.get_world_size() != world_size or dist.get_rank() != rank):
            raise RuntimeError(
                f"a process group already exists with rank {dist.get_rank()} of {dist.get_world_size()}, "
                f"but the environment says rank {rank} of {world_size}"
            )
        return False
    if callable(init_method):
        init_method = init_method()
    if device is not None and device.type == "cuda":
        torch.cuda.set_device(device)
    if in_process:
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    elif assign_ranks and rank is not None and world_size is not None:  # given together (see Args)
        dist.init_process_group(
            backend=backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout
        )
    else:
        dist.init_process_group(backend=backend, init_method=init_method, timeout=timeout)
    return True
