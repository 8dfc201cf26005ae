"""Bytes held by each module of a ``torch.nn.Module`` tree, counting shared tensors once.

A tensor reachable under several names (tied embeddings and LM heads, shared encoder and
decoder embeddings) adds its size once to every module that holds it, and once to the root.
Accelerate's ``compute_module_sizes`` keeps only the first name of a tied tensor: the other
modules holding it (the LM head tied to the embedding) get no size at all, so a device-map
planner may put them where their weight does not fit.

The tensors are first described as plain data (``TensorInfo``: names, shape, dtype), so a tool
can compute sizes again, in other dtypes, or from a cached description, without torch.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from x_common.dtypes import dtype_bits, dtype_name, is_floating, tensor_nbytes

if TYPE_CHECKING:
    import torch

__all__ = ["TensorInfo", "module_sizes", "named_tensors", "sizes_of", "tensor_infos", "tensor_key"]


def tensor_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    """Identity of the memory behind ``tensor``: equal keys mean one allocation, counted once.

    Meta tensors own no storage, so they are told apart by object identity (tied parameters
    are the same ``Parameter`` object); real tensors by storage address, offset and layout,
    which also catches two ``Parameter`` objects that view the same memory.
    """
    if tensor.device.type == "meta":
        return ("meta", id(tensor))
    return (
        str(tensor.device),
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
    )


def named_tensors(module: torch.nn.Module, *, include_buffers: bool = True) -> list[tuple[str, torch.Tensor]]:
    """Every (qualified name, tensor) of ``module``'s parameters and buffers, duplicates kept."""
    pairs: list[tuple[str, torch.Tensor]] = list(module.named_parameters(remove_duplicate=False))
    if include_buffers:
        pairs.extend((name, buf) for name, buf in module.named_buffers(remove_duplicate=False) if buf is not None)
    return pairs


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as data: every name it is reachable under, its shape and dtype name."""

    names: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    is_parameter: bool = True
    requires_grad: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def nbytes(self, dtype: Any = None) -> int:
        """Bytes at its own dtype, or at ``dtype`` if it is floating point (casts leave integers alone)."""
        if dtype is not None and is_floating(self.dtype):
            return tensor_nbytes(self.numel, dtype)
        return tensor_nbytes(self.numel, self.dtype)


def tensor_infos(module: torch.nn.Module, *, include_buffers: bool = True) -> list[TensorInfo]:
    """Describe each distinct tensor of ``module`` once, with all of its names, in module order."""
    names: dict[tuple[Any, ...], list[str]] = {}
    first: dict[tuple[Any, ...], tuple[torch.Tensor, bool]] = {}
    params = list(module.named_parameters(remove_duplicate=False))
    buffers = list(module.named_buffers(remove_duplicate=False)) if include_buffers else []
    for is_param, pairs in ((True, params), (False, buffers)):
        for name, tensor in pairs:
            if tensor is None:
                continue
            key = tensor_key(tensor)
            names.setdefault(key, []).append(name)
            first.setdefault(key, (tensor, is_param))
    return [
        TensorInfo(
            names=tuple(names[key]),
            shape=tuple(int(d) for d in tensor.shape),
            dtype=dtype_name(tensor.dtype),
            is_parameter=is_param,
            requires_grad=bool(tensor.requires_grad),
        )
        for key, (tensor, is_param) in first.items()
    ]


def sizes_of(tensors: Iterable[TensorInfo], dtype: Any = None) -> dict[str, int]:
    """Bytes under every prefix of every tensor name; ``""`` is the total. See ``module_sizes``."""
    if dtype is not None:
        dtype_bits(dtype)  # reject an unknown dtype even when no tensor is floating point
    sizes: dict[str, int] = defaultdict(int)
    for info in tensors:
        nbytes = info.nbytes(dtype)
        prefixes: set[str] = set()
        for name in info.names:
            parts = name.split(".")
            prefixes.update(".".join(parts[:i]) for i in range(len(parts) + 1))
        for prefix in prefixes:
            sizes[prefix] += nbytes
    sizes.setdefault("", 0)
    return dict(sizes)


def module_sizes(
    model: torch.nn.Module,
    dtype: Any = None,
    *,
    include_buffers: bool = True,
) -> dict[str, int]:
    """Bytes under every module and tensor name of ``model``; ``""`` is the whole model.

    Keys are every prefix of every parameter and buffer name (``""``, ``"encoder"``,
    ``"encoder.layer.0"``, ... down to ``"encoder.layer.0.weight"``), as in Accelerate, so a
    device-map planner can ask for any module or tensor.

    Args:
        model: the module to measure; meta-device skeletons work (nothing is allocated).
        dtype: size floating-point tensors as this dtype (``torch.float16``, ``"int4"``, ...)
            instead of their own; integer and boolean tensors keep their dtype, as a dtype cast
            leaves them alone.
        include_buffers: count buffers as well as parameters.

    Examples:
        >>> import torch
        >>> emb = torch.nn.Embedding(10, 4)
        >>> head = torch.nn.Linear(4, 10, bias=False)
        >>> head.weight = emb.weight  # tied
        >>> sizes = module_sizes(torch.nn.ModuleDict({"emb": emb, "head": head}))
        >>> sizes[""], sizes["emb"], sizes["head"]
        (160, 160, 160)
    """
    return sizes_of(tensor_infos(model, include_buffers=include_buffers), dtype)
