"""The default group's size, this process's rank in it, and the barrier: what every collective asks first.

Without an initialized ``torch.distributed`` these answer as a world of one process would, so the
same script runs with and without a launcher.
"""

from __future__ import annotations

import torch.distributed as dist

__all__ = ["barrier", "rank", "world_size"]


def world_size() -> int:
    """Number of processes in the default group, 1 when ``torch.distributed`` is not initialized.

    Examples:
        >>> world_size()
        1
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def rank() -> int:
    """This process's rank in the default group, 0 when ``torch.distributed`` is not initialized.

    Examples:
        >>> rank()
        0
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return 0


def barrier() -> None:
    """Wait until every process of the default group gets here (nothing to wait for without one)."""
    if world_size() == 1:
        return
    if dist.get_backend() == "xla":  # the xla backend's barrier returns at once
        import torch_xla.core.xla_model as xm

        from x_runtime.core.random_state import keep_xla_rng

        with keep_xla_rng():  # rendezvous cuts the graph
            xm.rendezvous("x_runtime.barrier")
    else:
        dist.barrier()
