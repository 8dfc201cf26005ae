"""Moving tensors between processes: which device and group a collective runs on, wire dtypes,
and the one-tensor all_gather every gather ends in.

The shape check, the gathers, the broadcasts and the shared integer all send through these, so
the backend's quirks (NCCL moves GPU tensors only, XLA its own, gloo refuses some dtypes) are
answered once.
"""

from __future__ import annotations

import functools
import operator
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "all_gather_rows",
    "as_rows",
    "data_device",
    "gather_into",
    "meta_device",
    "numel",
    "object_group",
    "on_xla_if_needed",
    "row_count",
    "source_rank",
    "wire",
]

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


def object_group() -> Any:
    """The group pickled objects travel in: the default one, except under XLA (tensors only)."""
    return _gloo_beside(dist.group.WORLD) if dist.get_backend() == "xla" else None


@functools.lru_cache(maxsize=1)
def _gloo_beside(world: Any) -> Any:
    # Keyed by the default group: a group created again (after a destroy) gets its own companion.
    # Every rank creates it at its first object collective, which every rank calls.
    return dist.new_group(backend="gloo")


def meta_device() -> torch.device:
    """Where the small int64 headers go: the one device type the backend's collectives take."""
    # NCCL only moves GPU tensors, XLA only XLA ones; the other backends here (gloo, cpu:gloo) take CPU.
    backend = dist.get_backend()
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    if backend == "xla":  # its collectives take XLA tensors only
        import torch_xla

        return torch_xla.device()
    return torch.device("cpu")


def data_device(tensor: torch.Tensor) -> torch.device:
    """Where ``tensor``'s data goes for a collective on the default group's backend."""
    backend = dist.get_backend()
    if backend in ("nccl", "xla"):
        return meta_device()
    if backend in ("gloo", "mpi"):
        return torch.device("cpu")
    return tensor.device  # mixed backends pick one by device


def on_xla_if_needed(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, on the XLA device when the backend is xla (it moves XLA tensors only)."""
    if dist.get_backend() != "xla" or tensor.device.type == "xla":
        return tensor
    return tensor.to(meta_device())


def wire(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` viewed as a dtype every backend carries, of the same width."""
    if tensor.dtype in _WIRE_NATIVE or tensor.element_size() not in _WIRE_BY_WIDTH:
        return tensor
    return tensor.view(_WIRE_BY_WIDTH[tensor.element_size()])


def gather_into(out: torch.Tensor, local: torch.Tensor) -> None:
    """``all_gather`` of ``local`` into the one tensor ``out``, rank after rank."""
    # One output tensor instead of a list of views: no staging copies on NCCL, and on gloo it
    # saves torch's per-call list handling. torch 2.13 renamed all_gather_into_tensor.
    single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    single(out, local)


def all_gather_rows(local: torch.Tensor, world: int) -> torch.Tensor:
    """``world`` equal-shaped, contiguous blocks gathered into one tensor, rank after rank along dim 0."""
    out = local.new_empty((world * local.shape[0], *local.shape[1:]))
    gather_into(wire(out), wire(local))
    return out


def as_rows(tensor: torch.Tensor) -> torch.Tensor:
    """A 0-d tensor as one row; others as they are."""
    return tensor.reshape(1) if tensor.dim() == 0 else tensor


def numel(shape: tuple[int, ...]) -> int:
    """Elements of a tensor of ``shape``."""
    count = 1
    for size in shape:
        count *= size
    return count


def row_count(shape: tuple[int, ...]) -> int:
    """Rows a tensor of ``shape`` adds to a gather (a 0-d tensor is one)."""
    return shape[0] if shape else 1


def source_rank(op: str, from_process: Any, world: int) -> int:
    """``from_process`` as a rank of this world; ValueError naming ``op`` otherwise."""
    try:
        source = operator.index(from_process)
    except TypeError:
        source = -1
    if isinstance(from_process, bool) or not 0 <= source < world:
        raise ValueError(f"{op}: from_process must be a rank in [0, {world}), got {from_process!r}")
    return source
