"""``reduce``: every tensor summed (or averaged, or its max or min taken) across processes, on copies."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from x_runtime.core.nested import apply
from x_runtime.process.collectives.debug import debug_mode, verify_operation
from x_runtime.process.collectives.shapes import raise_local_problems, walk_tensors
from x_runtime.process.collectives.transfer import object_group, on_xla_if_needed
from x_runtime.process.collectives.world import world_size

__all__ = ["reduce"]

_REDUCTIONS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def reduce(data: Any, reduction: str = "sum", scale: float = 1.0, *, debug: bool | None = None) -> Any:
    """Every tensor in ``data`` reduced across processes, then multiplied by ``scale``.

    Works on copies: the inputs are not modified. ``"mean"`` divides the sum by the world size
    (integer tensors come back as floating point); ``"none"`` communicates nothing and returns
    the scaled copies, as Accelerate documents (its code sums instead). ``scale`` applies on every
    backend, where Accelerate only applies it on TPU. The copies keep autograd history, like
    Accelerate's. Shapes must match across processes: in debug mode (``debug=True`` or
    ``X_DEBUG_MODE``) they are checked first and every process raises
    ``DistributedOperationException`` when they differ.

    Args:
        data: A tensor, or nested lists/tuples/named tuples/dicts of tensors.
        reduction: ``"sum"``, ``"mean"``, ``"max"``, ``"min"`` or ``"none"``.
        scale: Factor applied after the reduction.

    Returns:
        The same structure with the reduced tensors.

    Raises:
        ValueError: Unknown ``reduction``.
        DistributedOperationException: Debug mode, and the shapes differ across processes.
        TypeError: A leaf that is not a tensor.

    Examples:
        >>> import torch
        >>> reduce(torch.tensor([1.0, 2.0]), reduction="mean", scale=2.0)
        tensor([2., 4.])
    """
    if reduction not in _REDUCTIONS and reduction != "none":
        choices = ", ".join(repr(name) for name in [*_REDUCTIONS, "none"])
        raise ValueError(f"reduce: unknown reduction {reduction!r}; choose one of {choices}")
    raise_local_problems("reduce", walk_tensors(data))
    world = world_size()
    if world > 1 and reduction != "none" and debug_mode(debug):
        verify_operation("x_runtime.process.collectives.reduce", data, group=object_group())

    def one(tensor: torch.Tensor) -> torch.Tensor:
        result = tensor.clone()
        if reduction != "none" and world > 1:
            result = on_xla_if_needed(result)
            with torch.no_grad():  # the in-place collective is invisible to autograd either way
                dist.all_reduce(result, op=_REDUCTIONS[reduction])
            result = result.to(tensor.device)
        if reduction == "mean":
            result = result / world
        if scale != 1.0:  # an integer tensor times 1.0 would turn floating point for nothing
            result = result * scale
        return result

    return apply(one, data)
