"""Moving tensors for the collectives: wire dtypes, small tensors packed into one buffer, and
padded gathers of tensors whose first dimension differs across processes.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from x_runtime.core.nested import apply, flatten_tensors
from x_runtime.process._shape_check import _gather_into, _meta_device, _Table
from x_runtime.process.errors import CannotPadNestedTensorWarning

# Tensors up to this size travel together in one byte buffer: below it a collective's latency
# costs more than the copies into and out of the buffer.
_PACK_BYTES = 1 << 20

# Gloo rejects int16, the unsigned and float8 types (bool too before recent torch), NCCL has no
# int16; moving data never looks at the values, so those travel reinterpreted as a supported type
# of the same width.
_WIRE_NATIVE = {
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
}
_WIRE_BY_WIDTH = {1: torch.uint8, 2: torch.float16, 4: torch.int32, 8: torch.int64}


def _on_xla_if_needed(tensor: torch.Tensor) -> torch.Tensor:
    # The xla backend moves XLA tensors only; a CPU tensor takes a round trip through the device.
    if dist.get_backend() != "xla" or tensor.device.type == "xla":
        return tensor
    return tensor.to(_meta_device())


def _as_rows(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(1) if tensor.dim() == 0 else tensor


def _wire(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype in _WIRE_NATIVE or tensor.element_size() not in _WIRE_BY_WIDTH:
        return tensor
    return tensor.view(_WIRE_BY_WIDTH[tensor.element_size()])


def _data_device(tensor: torch.Tensor) -> torch.device:
    backend = dist.get_backend()
    if backend in ("nccl", "xla"):
        return _meta_device()
    if backend in ("gloo", "mpi"):
        return torch.device("cpu")
    return tensor.device  # mixed backends pick one by device


def _all_gather_rows(local: torch.Tensor, world: int) -> torch.Tensor:
    """``world`` equal-shaped, contiguous blocks gathered into one tensor, rank after rank along dim 0."""
    out = local.new_empty((world * local.shape[0], *local.shape[1:]))
    _gather_into(_wire(out), _wire(local))
    return out


def _gather_checked(table: _Table, world: int) -> list[torch.Tensor]:
    itemsizes = [tensor.element_size() for tensor in table.tensors]
    nbytes = [
        [itemsize * _numel(shape) for shape in shapes] for itemsize, shapes in zip(itemsizes, table.shapes, strict=True)
    ]
    small = [i for i, sizes in enumerate(nbytes) if max(sizes) <= _PACK_BYTES]
    results: list[torch.Tensor | None] = [None] * len(table.tensors)
    if len(small) > 1:  # packing pays off only when it saves a collective
        for i, result in zip(small, _gather_packed(table, small, nbytes, world), strict=True):
            results[i] = result
    for i, tensor in enumerate(table.tensors):
        if results[i] is None:
            results[i] = _gather_one(tensor, [_rows(shape) for shape in table.shapes[i]], world)
    return results  # type: ignore[return-value]


def _gather_packed(table: _Table, which: list[int], nbytes: list[list[int]], world: int) -> list[torch.Tensor]:
    """The small tensors ``which`` gathered in one collective, as bytes in one buffer per process."""
    me = dist.get_rank()
    offsets = [[0] * world for _ in which]  # offsets[k][rank] of tensor which[k] in that rank's block
    totals = [0] * world
    for k, i in enumerate(which):
        for r in range(world):
            offsets[k][r] = totals[r]
            totals[r] += nbytes[i][r]
    block = max(totals)
    device = _data_device(table.tensors[which[0]])
    local = torch.empty(block, dtype=torch.uint8, device=device)
    for k, i in enumerate(which):
        start = offsets[k][me]
        local[start : start + nbytes[i][me]].copy_(table.tensors[i].contiguous().view(-1).view(torch.uint8))
    gathered = _all_gather_rows(local, world) if block else local
    results = []
    for k, i in enumerate(which):
        tensor = table.tensors[i]
        pieces = [gathered[r * block + offsets[k][r] : r * block + offsets[k][r] + nbytes[i][r]] for r in range(world)]
        rows = sum(_rows(shape) for shape in table.shapes[i])
        joined = torch.cat(pieces).view(tensor.dtype).view(rows, *tensor.shape[1:])
        results.append(joined.to(tensor.device))
    return results


def _gather_one(tensor: torch.Tensor, rows: list[int], world: int) -> torch.Tensor:
    longest = max(rows)
    local = _as_rows(tensor).to(_data_device(tensor)).contiguous()
    if local.shape[0] < longest:
        padded = local.new_empty((longest, *local.shape[1:]))
        padded[: local.shape[0]] = local
        local = padded
    gathered = _all_gather_rows(local, world)
    if any(count != longest for count in rows):
        gathered = torch.cat([gathered[r * longest : r * longest + rows[r]] for r in range(world)])
    return gathered.to(tensor.device)


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _rows(shape: tuple[int, ...]) -> int:
    return shape[0] if shape else 1


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


def _source_rank(op: str, from_process: Any, world: int) -> int:
    try:
        source = operator.index(from_process)
    except TypeError:
        source = -1
    if isinstance(from_process, bool) or not 0 <= source < world:
        raise ValueError(f"{op}: from_process must be a rank in [0, {world}), got {from_process!r}")
    return source


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
