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
    "concatenate",
    "find_batch_size",
    "flatten_tensors",
    "is_namedtuple",
    "is_torch_tensor",
    "listify",
    "pad_input_tensors",
    "recursively_apply",
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


def is_torch_tensor(value: Any) -> bool:
    """Whether ``value`` is a ``torch.Tensor``: the leaves :func:`apply` works on by default."""
    return isinstance(value, torch.Tensor)


def apply(
    func: Callable[[Any], Any],
    data: Any,
    *,
    strict: bool = False,
    is_leaf: Callable[[Any], bool] = is_torch_tensor,
    on_other: Callable[[Any], Any] | None = None,
) -> Any:
    """``func`` applied to every leaf (tensor) inside ``data``, containers rebuilt as they were.

    Other values are returned unchanged, passed to ``on_other`` (which may raise), or rejected
    with ``strict=True``. ``is_leaf`` says what a leaf is (a tensor unless told otherwise).

    Examples:
        >>> apply(lambda t: t * 2, {"x": torch.tensor([1]), "y": (torch.tensor([2]), "label")})
        {'x': tensor([2]), 'y': (tensor([4]), 'label')}
    """
    if is_leaf(data):
        return func(data)

    def again(item: Any) -> Any:
        return apply(func, item, strict=strict, is_leaf=is_leaf, on_other=on_other)

    if is_namedtuple(data):
        return type(data)(*(again(item) for item in data))
    if isinstance(data, (list, tuple)):
        return type(data)(again(item) for item in data)
    if isinstance(data, Mapping):
        return _same_mapping(data, {key: again(value) for key, value in data.items()})
    if strict:
        raise TypeError(f"expected tensors or nested lists/tuples/dicts of tensors, got {type(data).__name__}")
    return data if on_other is None else on_other(data)


def recursively_apply(
    func: Callable[..., Any],
    data: Any,
    *args: Any,
    test_type: Callable[[Any], bool] = is_torch_tensor,
    error_on_other_type: bool = False,
    **kwargs: Any,
) -> Any:
    """Accelerate's spelling of :func:`apply`: ``func(leaf, *args, **kwargs)`` on every leaf ``test_type`` accepts.

    Raises:
        TypeError: ``error_on_other_type`` and a value that is neither a leaf nor a container.

    Examples:
        >>> recursively_apply(torch.add, [torch.tensor(1), "x"], 10)
        [tensor(11), 'x']
    """

    def reject(value: Any) -> Any:
        raise TypeError(
            f"Unsupported types ({type(value)}) passed to `{getattr(func, '__name__', func)}`. Only nested "
            f"list/tuple/dicts of objects that are valid for `{getattr(test_type, '__name__', test_type)}` "
            "should be passed."
        )

    return apply(
        lambda leaf: func(leaf, *args, **kwargs),
        data,
        is_leaf=test_type,
        on_other=reject if error_on_other_type else None,
    )


def listify(data: Any) -> Any:
    """Every tensor inside ``data`` as (nested) Python lists of numbers, on the CPU; bfloat16 read as float32.

    Examples:
        >>> listify({"loss": torch.tensor([1.5, 2.0])})
        {'loss': [1.5, 2.0]}
    """

    def to_list(tensor: torch.Tensor) -> Any:
        tensor = tensor.detach().cpu()
        return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).tolist()

    return apply(to_list, data)


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


def _join(parts: list[Any] | tuple[Any, ...], leaf: Callable[[Any], Any], is_column: Callable[[Any], bool]) -> Any:
    """``parts`` (batches of one structure) joined field by field; ``leaf`` joins what is not a container."""
    first = parts[0]
    if is_namedtuple(first):
        return type(first)(*(_join([part[i] for part in parts], leaf, is_column) for i in range(len(first))))
    if isinstance(first, Mapping):
        return _same_mapping(first, {key: _join([part[key] for part in parts], leaf, is_column) for key in first})
    if isinstance(first, (list, tuple)) and not is_column(first):
        return type(first)(_join([part[i] for part in parts], leaf, is_column) for i in range(len(first)))
    return leaf(parts)


def concat_batches(parts: list[Any]) -> Any:
    """Collated batches joined along dim 0, structure kept (the inverse of :func:`slice_batch`).

    Examples:
        >>> concat_batches([{"x": torch.tensor([0]), "n": ("a",)}, {"x": torch.tensor([1]), "n": ("b",)}])
        {'x': tensor([0, 1]), 'n': ('a', 'b')}
    """

    def leaf(values: list[Any]) -> Any:
        first = values[0]
        if isinstance(first, torch.Tensor):
            return torch.cat(values, dim=0)
        if isinstance(first, (list, tuple)):  # a column of plain values
            return type(first)(item for part in values for item in part)
        return first

    return _join(parts, leaf, lambda sequence: not _holds_structure(sequence))


def concatenate(data: list[Any] | tuple[Any, ...], dim: int = 0) -> Any:
    """Batches of one structure joined along ``dim``; a single batch of anything comes back as it is.

    Raises:
        TypeError: several batches whose leaves are not tensors (they cannot be joined).

    Examples:
        >>> concatenate([{"x": torch.tensor([0])}, {"x": torch.tensor([1])}])
        {'x': tensor([0, 1])}
    """

    def leaf(values: list[Any]) -> Any:
        if isinstance(values[0], torch.Tensor):
            return torch.cat(list(values), dim=dim)
        if len(values) == 1:
            return values[0]
        raise TypeError(f"concatenate: can only join tensors, got {type(values[0]).__name__}")

    return _join(data, leaf, lambda _sequence: False)


def pad_input_tensors(data: Any, batch_size: int, num_processes: int, dim: int = 0) -> Any:
    """Every tensor's ``batch_size`` rows along ``dim`` zero-padded to the next multiple of ``num_processes``.

    So that a batch splits evenly between processes (each gets at least one row); a
    ``batch_size`` already a multiple comes back unchanged.

    Raises:
        TypeError: a value that is neither a tensor nor a container.

    Examples:
        >>> pad_input_tensors(torch.ones(3, 2), batch_size=3, num_processes=2).shape
        torch.Size([4, 2])
    """
    if num_processes < 1:
        raise ValueError(f"pad_input_tensors: num_processes must be at least 1, got {num_processes}")
    target = max(-(-batch_size // num_processes), 1) * num_processes

    def pad(tensor: torch.Tensor) -> torch.Tensor:
        missing = target - tensor.shape[dim]
        if missing <= 0:
            return tensor
        shape = list(tensor.shape)
        shape[dim] = missing
        return torch.cat([tensor, tensor.new_zeros(shape)], dim=dim)

    return recursively_apply(pad, data, error_on_other_type=True)
