"""Walking nested batches: lists, tuples, named tuples, dicts and mappings of tensors.

Batches and model outputs arrive as nested containers (a dict of tensors, a transformers
``BatchEncoding``, a tuple of ``(inputs, labels)``). Every operation that moves, slices, pads or
gathers them goes through :func:`apply`, which rebuilds the same container types around the
results, so callers get back what they passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import torch

__all__ = [
    "apply",
    "concat_batches",
    "find_batch_size",
    "flatten_tensors",
    "is_namedtuple",
    "send_to_device",
    "slice_batch",
]


def is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def _same_mapping(like: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    """``items`` as ``like``'s mapping type, or the plain dict when that type's constructor takes something else."""
    # Mapping declares no constructor; the concrete types (dict, OrderedDict, BatchEncoding) take a dict.
    rebuild = cast("Callable[[dict[Any, Any]], Any]", type(like))
    try:
        return rebuild(items)
    except TypeError:
        return items


def apply(func: Callable[[torch.Tensor], Any], data: Any, *, strict: bool = False) -> Any:
    """``func`` applied to every tensor inside ``data``, containers rebuilt as they were.

    Non-tensor leaves are returned unchanged, or rejected with ``strict=True``.

    Examples:
        >>> apply(lambda t: t * 2, {"x": torch.tensor([1]), "y": (torch.tensor([2]), "label")})
        {'x': tensor([2]), 'y': (tensor([4]), 'label')}
    """
    if isinstance(data, torch.Tensor):
        return func(data)
    if is_namedtuple(data):
        return type(data)(*(apply(func, item, strict=strict) for item in data))
    if isinstance(data, (list, tuple)):
        return type(data)(apply(func, item, strict=strict) for item in data)
    if isinstance(data, Mapping):
        return _same_mapping(data, {key: apply(func, value, strict=strict) for key, value in data.items()})
    if strict:
        raise TypeError(f"expected tensors or nested lists/tuples/dicts of tensors, got {type(data).__name__}")
    return data


def flatten_tensors(data: Any) -> list[torch.Tensor]:
    """Every tensor inside ``data`` in traversal order."""
    found: list[torch.Tensor] = []
    apply(found.append, data)
    return found


def send_to_device(data: Any, device: torch.device | str, *, non_blocking: bool = False) -> Any:
    """``data`` with every tensor on ``device``; tensors already there are not copied.

    Examples:
        >>> send_to_device({"x": torch.ones(2)}, "cpu")["x"].device
        device(type='cpu')
    """
    target = torch.device(device)

    def move(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device == target:
            return tensor
        return tensor.to(target, non_blocking=non_blocking)

    return apply(move, data)


def find_batch_size(data: Any) -> int | None:
    """Length along dim 0 of the first tensor with at least one dimension, or ``None``."""
    for tensor in flatten_tensors(data):
        if tensor.dim() > 0:
            return int(tensor.shape[0])
    return None


def _holds_structure(items: list[Any] | tuple[Any, ...]) -> bool:
    # A list or tuple holding containers is a structure (fields); one of plain values (strings,
    # numbers, as default_collate leaves them) is a column of samples, cut and joined like a tensor.
    return any(isinstance(item, (torch.Tensor, Mapping, tuple, list)) for item in items)


def slice_batch(data: Any, index: slice) -> Any:
    """Rows ``index`` of every tensor; a list or tuple of plain values is a column, sliced too.

    Examples:
        >>> slice_batch({"x": torch.arange(4), "name": ("a", "b", "c", "d")}, slice(0, 2))
        {'x': tensor([0, 1]), 'name': ('a', 'b')}
    """
    if isinstance(data, torch.Tensor):
        return data[index]
    if is_namedtuple(data):
        return type(data)(*(slice_batch(item, index) for item in data))
    if isinstance(data, Mapping):
        return _same_mapping(data, {key: slice_batch(value, index) for key, value in data.items()})
    if isinstance(data, (list, tuple)):
        if _holds_structure(data):
            return type(data)(slice_batch(item, index) for item in data)
        return data[index]
    return data


def concat_batches(parts: list[Any]) -> Any:
    """Collated batches joined along dim 0, structure kept (the inverse of :func:`slice_batch`).

    Examples:
        >>> concat_batches([{"x": torch.tensor([0]), "n": ("a",)}, {"x": torch.tensor([1]), "n": ("b",)}])
        {'x': tensor([0, 1]), 'n': ('a', 'b')}
    """
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts, dim=0)
    if is_namedtuple(first):
        return type(first)(*(concat_batches([part[i] for part in parts]) for i in range(len(first))))
    if isinstance(first, Mapping):
        return _same_mapping(first, {key: concat_batches([part[key] for part in parts]) for key in first})
    if isinstance(first, (list, tuple)):
        if _holds_structure(first):
            return type(first)(concat_batches([part[i] for part in parts]) for i in range(len(first)))
        return type(first)(item for part in parts for item in part)
    return first
