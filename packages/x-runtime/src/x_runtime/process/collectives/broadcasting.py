"""Broadcasts: one process's tensors, objects, integer or lone tensor, copied to every process.

``broadcast`` and ``broadcast_object_list`` overwrite what every process passed, in place, as
Accelerate's do; ``broadcast_int`` shares one int64 without pickling (``shared_int`` starts it
asynchronously); ``copy_tensor_to_devices`` serves the case where only the source holds a tensor.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from x_runtime.core.nested import apply
from x_runtime.process.collectives.debug import debug_mode, verify_operation
from x_runtime.process.collectives.errors import DistributedOperationException
from x_runtime.process.collectives.shapes import raise_local_problems, walk_tensors
from x_runtime.process.collectives.shared_int import share_int
from x_runtime.process.collectives.transfer import object_group, on_xla_if_needed, source_rank, wire
from x_runtime.process.collectives.world import world_size

__all__ = ["broadcast", "broadcast_int", "broadcast_object_list", "copy_tensor_to_devices"]


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
        >>> import torch
        >>> weights = {"w": torch.ones(2)}
        >>> broadcast(weights, from_process=0) is weights
        True
    """
    world = world_size()
    source = source_rank("broadcast", from_process, world)
    raise_local_problems("broadcast", walk_tensors(data))
    if world == 1:
        return data
    if debug_mode(debug):
        verify_operation("x_runtime.process.collectives.broadcast", data, group=object_group())

    def one(tensor: torch.Tensor) -> None:
        target = tensor.detach()  # same storage; lets parameters (leaves needing grad) be overwritten
        buffer = on_xla_if_needed(target if target.is_contiguous() else target.contiguous())
        dist.broadcast(wire(buffer), src=source)
        if buffer is not target:
            target.copy_(buffer)

    apply(one, data)
    return data


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
    source = source_rank("broadcast_object_list", from_process, world)
    if world > 1:
        if debug_mode(debug):
            verify_operation(
                "x_runtime.process.collectives.broadcast_object_list", object_list, key=len, group=object_group()
            )
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
        >>> import torch
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
