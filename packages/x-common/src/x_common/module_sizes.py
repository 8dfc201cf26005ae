"""Bytes held by each module of a ``torch.nn.Module`` tree, counting shared tensors once.

A tensor reachable under several names (tied embeddings and LM heads, shared encoder and
decoder embeddings) adds its size once to every module that holds it, and once to the root.
Accelerate's ``compute_module_sizes`` keeps only the first name of a tied tensor: the other
modules holding it (the LM head tied to the embedding) get no size at all, so a device-map
planner may put them where their weight does not fit.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from x_common.dtypes import dtype_bits, is_floating, tensor_nbytes

if TYPE_CHECKING:
    import torch

__all__ = ["module_sizes", "named_tensors", "tensor_key"]


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
    target_bits = dtype_bits(dtype) if dtype is not None else None
    sizes: dict[str, int] = defaultdict(int)
    names_by_key: dict[tuple[Any, ...], list[str]] = {}
    tensor_by_key: dict[tuple[Any, ...], torch.Tensor] = {}
    for name, tensor in named_tensors(model, include_buffers=include_buffers):
        key = tensor_key(tensor)
        names_by_key.setdefault(key, []).append(name)
        tensor_by_key[key] = tensor
    for key, names in names_by_key.items():
        tensor = tensor_by_key[key]
        if target_bits is not None and is_floating(tensor.dtype):
            nbytes = tensor_nbytes(tensor.numel(), dtype)
        else:
            nbytes = tensor_nbytes(tensor.numel(), tensor.dtype)
        prefixes: set[str] = set()
        for name in names:
            parts = name.split(".")
            prefixes.update(".".join(parts[:i]) for i in range(len(parts) + 1))
        for prefix in prefixes:
            sizes[prefix] += nbytes
    sizes.setdefault("", 0)
    return dict(sizes)
