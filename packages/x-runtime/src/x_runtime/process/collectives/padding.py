"""``pad_across_processes``: every tensor padded along one dim to the largest size any process has there.

One small collective (the shape check) tells every process every size, so all pad to the same
target, or all raise the same error. Nested (jagged) tensors have no one size: they come back as
they are, with a warning.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from x_runtime.core.nested import apply, flatten_tensors
from x_runtime.process.collectives.errors import CannotPadNestedTensorWarning, DistributedOperationException
from x_runtime.process.collectives.shapes import by_rank, check_shapes, raise_local_problems, rebuild, walk_tensors
from x_runtime.process.collectives.world import world_size

__all__ = ["pad_across_processes"]


def pad_across_processes(
    data: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False, *, debug: bool | None = None
) -> Any:
    """Every tensor in ``data`` padded along ``dim`` to the largest size any process has there.

    One small collective exchanges the shapes for the whole structure. Tensors with ``dim`` out of
    range are returned unchanged (as in Accelerate), and so are tensors already at the largest size.
    Processes must agree on the structure and on each tensor's number of dimensions.

    Args:
        data: A tensor, or nested lists/tuples/named tuples/dicts of tensors.
        dim: The dimension to pad; negative values count from the end.
        pad_index: The value written into the padding.
        pad_first: Pad at the start of ``dim`` instead of the end.

    Returns:
        The same structure with padded tensors.

    Raises:
        DistributedOperationException: (a ``ValueError``) Processes passed different structures
            or numbers of dimensions (checked always; ``debug`` changes nothing here).
        TypeError: Some process passed a leaf that is not a tensor.

    Examples:
        >>> import torch
        >>> pad_across_processes(torch.tensor([1, 2]), pad_index=-1)
        tensor([1, 2])
    """
    if any(t.is_nested for t in flatten_tensors(data)):
        return _around_nested(data, lambda stand_in: pad_across_processes(stand_in, dim, pad_index, pad_first))
    world = world_size()
    if world == 1:
        raise_local_problems("pad_across_processes", walk_tensors(data))
        return data
    table = check_shapes("pad_across_processes", data, world)
    results = []
    for i, tensor in enumerate(table.tensors):
        shapes = table.shapes[i]
        if len({len(shape) for shape in shapes}) > 1:
            at = f" at {table.paths[i]}" if table.paths[i] else ""
            raise DistributedOperationException(
                f"pad_across_processes: tensors have different numbers of dimensions across processes{at}: "
                f"{by_rank(map(str, shapes))}"
            )
        ndim = tensor.dim()
        if not -ndim <= dim < ndim:
            results.append(tensor)
            continue
        axis = dim % ndim
        target = max(shape[axis] for shape in shapes)
        results.append(_pad(tensor, axis, target, pad_index, pad_first))
    return rebuild(data, results)


def _pad(tensor: torch.Tensor, axis: int, target: int, value: Any, first: bool) -> torch.Tensor:
    size = tensor.shape[axis]
    if size == target:
        return tensor
    shape = list(tensor.shape)
    shape[axis] = target
    padded = tensor.new_full(shape, value)
    start = target - size if first else 0
    padded.narrow(axis, start, size).copy_(tensor)
    return padded


def _around_nested(data: Any, pad: Callable[[Any], Any]) -> Any:
    """``pad(data)`` with every nested tensor left out (an empty stand-in goes through) and put back as it was."""
    warnings.warn(
        "pad_across_processes: a nested tensor has no one size to pad; it is returned unchanged",
        CannotPadNestedTensorWarning,
        stacklevel=3,
    )
    originals = iter(flatten_tensors(data))
    padded = pad(apply(lambda t: torch.empty(0, dtype=t.dtype, device=t.device) if t.is_nested else t, data))
    return apply(lambda t: original if (original := next(originals)).is_nested else t, padded)
