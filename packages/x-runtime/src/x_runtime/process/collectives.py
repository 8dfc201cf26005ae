"""Collectives over nested batches: gather, pad, reduce and broadcast across processes.

Every function works on the default ``torch.distributed`` process group and takes the same nested
containers as :mod:`x_runtime.core.nested` (tensors inside lists, tuples, named tuples, dicts). When
``torch.distributed`` is not initialized, or the world has one process, they return what a
one-process world would return, so the same script runs with and without a launcher.

Why the shape check: ``all_gather`` needs every process to send tensors of one shape and dtype;
when they don't, the backend hangs or fails on some processes only. ``gather`` and
``pad_across_processes`` exchange a small int64 header describing the whole structure, so every
process reaches the same verdict: all raise the same ``DistributedOperationException`` (a
``ValueError``) naming each rank's shape, or all go on. ``gather`` sends the header and the data
in one collective once a first gather on the group has sized it (``_gather_fold``). ``gather`` also accepts different sizes
along dim 0 (padded, gathered, trimmed). The others check in debug mode only (``process.debug``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from x_runtime.core.nested import apply, flatten_tensors
from x_runtime.process._gather_fold import gather_tensors
from x_runtime.process._shape_check import (
    _by_rank,
    _check_shapes,
    _raise_local_problems,
    _rebuild,
    _walk,
    object_group,
)
from x_runtime.process._transfer import _around_nested, _as_rows, _on_xla_if_needed, _pad, _source_rank, _wire
from x_runtime.process.debug import debug_mode, verify_operation
from x_runtime.process.errors import DistributedOperationException
from x_runtime.process.shared_int import share_int

__all__ = [
    "barrier",
    "broadcast",
    "broadcast_int",
    "broadcast_object_list",
    "copy_tensor_to_devices",
    "gather",
    "gather_object",
    "pad_across_processes",
    "rank",
    "reduce",
    "world_size",
]


_OPS = "x_runtime.process.collectives"
_REDUCTIONS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


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


def gather(data: Any, *, debug: bool | None = None) -> Any:
    """Every tensor in ``data`` gathered from all processes and concatenated along dim 0 in rank order.

    Containers are rebuilt around the results. A 0-d tensor counts as one row, so gathering a
    scalar gives a 1-d tensor of ``world_size()`` values (on one process too). Processes must agree
    on the structure, the dtypes and every dim but the first: otherwise all of them raise the same
    ``ValueError``. Dim 0 may differ (unlike Accelerate): each process's rows are padded, gathered
    and trimmed back, so nothing needs ``pad_across_processes`` first. Results are on the device of
    the input tensor. On one process the input tensors themselves come back (0-d ones as views).
    Gathered tensors carry no autograd history (as in Accelerate): a tensor that requires grad
    is gathered like any other. The shapes are checked always, so ``debug`` changes nothing here.

    Args:
        data: A tensor, or nested lists/tuples/named tuples/dicts of tensors.

    Returns:
        The same structure with every tensor replaced by the concatenation of all processes' tensors.

    Raises:
        DistributedOperationException: (a ``ValueError``) Processes passed different structures,
            dtypes, or shapes beyond dim 0.
        TypeError: Some process passed a leaf that is not a tensor.

    Examples:
        >>> gather({"preds": torch.tensor([1, 2]), "loss": torch.tensor(0.5)})
        {'preds': tensor([1, 2]), 'loss': tensor([0.5000])}
    """
    world = world_size()
    if world == 1:
        _raise_local_problems("gather", _walk(data))
        return apply(_as_rows, data)
    return _rebuild(data, gather_tensors(data, world))


def gather_object(obj: Any, *, debug: bool | None = None) -> list[Any]:
    """Every process's list, concatenated in rank order (Accelerate semantics).

    A list contributes its items; anything else, tuples and dicts included, contributes itself as
    one item (Accelerate would spread a tuple, a dict's keys or a string's characters). Objects go
    through pickle, so keep them small.

    Args:
        obj: A list of picklable objects, or one picklable object.

    Returns:
        A new list: rank 0's items, then rank 1's, and so on.

    Examples:
        >>> gather_object(["a", "b"])
        ['a', 'b']
        >>> gather_object({"id": 3})
        [{'id': 3}]
    """
    world = world_size()
    if world == 1:
        return list(obj) if isinstance(obj, list) else [obj]
    if debug_mode(debug):
        verify_operation(f"{_OPS}.gather_object", obj, key=lambda _obj: None, group=object_group())
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, obj, group=object_group())
    out: list[Any] = []
    for item in gathered:
        if isinstance(item, list):
            out.extend(item)
        else:
            out.append(item)
    return out


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
        >>> pad_across_processes(torch.tensor([1, 2]), pad_index=-1)
        tensor([1, 2])
    """
    if any(t.is_nested for t in flatten_tensors(data)):
        return _around_nested(data, lambda stand_in: pad_across_processes(stand_in, dim, pad_index, pad_first))
    world = world_size()
    if world == 1:
        _raise_local_problems("pad_across_processes", _walk(data))
        return data
    table = _check_shapes("pad_across_processes", data, world)
    results = []
    for i, tensor in enumerate(table.tensors):
        shapes = table.shapes[i]
        if len({len(shape) for shape in shapes}) > 1:
            at = f" at {table.paths[i]}" if table.paths[i] else ""
            raise DistributedOperationException(
                f"pad_across_processes: tensors have different numbers of dimensions across processes{at}: "
                f"{_by_rank(map(str, shapes))}"
            )
        ndim = tensor.dim()
        if not -ndim <= dim < ndim:
            results.append(tensor)
            continue
        axis = dim % ndim
        target = max(shape[axis] for shape in shapes)
        results.append(_pad(tensor, axis, target, pad_index, pad_first))
    return _rebuild(data, results)


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
        >>> reduce(torch.tensor([1.0, 2.0]), reduction="mean", scale=2.0)
        tensor([2., 4.])
    """
    if reduction not in _REDUCTIONS and reduction != "none":
        choices = ", ".join(repr(name) for name in [*_REDUCTIONS, "none"])
        raise ValueError(f"reduce: unknown reduction {reduction!r}; choose one of {choices}")
    _raise_local_problems("reduce", _walk(data))
    world = world_size()
    if world > 1 and reduction != "none" and debug_mode(debug):
        verify_operation(f"{_OPS}.reduce", data, group=object_group())

    def one(tensor: torch.Tensor) -> torch.Tensor:
        result = tensor.clone()
        if reduction != "none" and world > 1:
            result = _on_xla_if_needed(result)
            with torch.no_grad():  # the in-place collective is invisible to autograd either way
                dist.all_reduce(result, op=_REDUCTIONS[reduction])
            result = result.to(tensor.device)
        if reduction == "mean":
            result = result / world
        if scale != 1.0:  # an integer tensor times 1.0 would turn floating point for nothing
            result = result * scale
        return result

    return apply(one, data)


def broadcast(data: Any, from_process: int = 0, *, debug: bool | None = None) -> Any:
    """Every tensor in ``data`` overwritten, in place, with the values of process ``from_process``.

    In place like Accelerate: every process must already hold tensors of the right shapes and
    dtypes (checked in debug mode only: ``debug=True`` or ``X_DEBUG_MODE``). Returns ``data`` itself.

    Args:
        data: A tensor, or nested lists/tuples/named tuples/dicts of tensors.
        from_process: Rank whose values everyone receives.

    Returns:
        ``data``, now holding ``from_process``'s values.

    Raises:
        ValueError: ``from_process`` is not a rank of this world.
        DistributedOperationException: Debug mode, and the shapes differ across processes.
        TypeError: A leaf that is not a tensor.

    Examples:
        >>> weights = {"w": torch.ones(2)}
        >>> broadcast(weights, from_process=0) is weights
        True
    """
    world = world_size()
    source = _source_rank("broadcast", from_process, world)
    _raise_local_problems("broadcast", _walk(data))
    if world == 1:
        return data
    if debug_mode(debug):
        verify_operation(f"{_OPS}.broadcast", data, group=object_group())

    def one(tensor: torch.Tensor) -> None:
        target = tensor.detach()  # same storage; lets parameters (leaves needing grad) be overwritten
        buffer = _on_xla_if_needed(target if target.is_contiguous() else target.contiguous())
        dist.broadcast(_wire(buffer), src=source)
        if buffer is not target:
            target.copy_(buffer)

    apply(one, data)
    return data


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


def broadcast_object_list(object_list: list[Any], from_process: int = 0, *, debug: bool | None = None) -> list[Any]:
    """``object_list`` overwritten, in place, with process ``from_process``'s items (pickled).

    Every process must pass a list of the same length. Returns ``object_list`` itself.

    Args:
        object_list: Picklable items; only ``from_process``'s values matter.
        from_process: Rank whose items everyone receives.

    Returns:
        ``object_list``, now holding ``from_process``'s items.

    Raises:
        ValueError: ``from_process`` is not a rank of this world.

    Examples:
        >>> broadcast_object_list([1, "two"])
        [1, 'two']
    """
    world = world_size()
    source = _source_rank("broadcast_object_list", from_process, world)
    if world > 1:
        if debug_mode(debug):
            verify_operation(f"{_OPS}.broadcast_object_list", object_list, key=len, group=object_group())
        dist.broadcast_object_list(object_list, src=source, group=object_group())
    return object_list


def broadcast_int(value: int, from_process: int = 0) -> int:
    """``from_process``'s integer (an int64) on every process: one tensor broadcast, nothing pickled.

    What ``prepare`` shares (a shuffle seed): ``broadcast_object_list`` would pickle it and make two
    collectives, its size and then its bytes.

    Examples:
        >>> broadcast_int(7)
        7
    """
    return share_int(value, from_process).result()


def copy_tensor_to_devices(
    tensor: torch.Tensor | None = None, *, device: torch.device | str | None = None
) -> torch.Tensor:
    """The tensor that exactly one process holds, copied to every process (Accelerate's name).

    Unlike ``broadcast``, the other processes pass ``None`` and need not know its shape or dtype:
    one small pickled exchange tells them, then the values are broadcast.

    Args:
        tensor: The tensor on the one process that has it, ``None`` on the others.
        device: Where the copies go on the other processes; defaults to the CPU (the current CUDA
            device under NCCL).

    Raises:
        DistributedOperationException: No process, or more than one, passed a tensor.

    Examples:
        >>> copy_tensor_to_devices(torch.tensor([1, 2, 3]))
        tensor([1, 2, 3])
    """
    world = world_size()
    if world == 1:
        if tensor is None:
            raise DistributedOperationException("copy_tensor_to_devices: no process passed a tensor")
        return tensor
    mine = None if tensor is None else (list(tensor.shape), str(tensor.dtype).removeprefix("torch."))
    found: list[Any] = [None] * world
    dist.all_gather_object(found, mine, group=object_group())
    holders = [r for r, entry in enumerate(found) if entry is not None]
    if len(holders) != 1:
        raise DistributedOperationException(
            f"copy_tensor_to_devices: exactly one process must pass a tensor, the others None; got tensors on "
            f"{'no process' if not holders else 'processes ' + ', '.join(map(str, holders))}"
        )
    source = holders[0]
    if tensor is None:
        shape, dtype = found[source]
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
        tensor = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
    return broadcast(tensor, from_process=source)
