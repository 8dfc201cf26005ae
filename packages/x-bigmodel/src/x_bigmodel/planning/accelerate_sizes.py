"""Accelerate's size and tie helpers, with its names and its counting, for code that calls them.

x's own planning counts a tied tensor once in the total and in every module holding it
(``x_common.module_sizes``); these functions count as Accelerate's do (a tied parameter in its
first holder only, ``torch.bool`` as 1/8 byte), so code written against Accelerate gets the same
numbers. ``dtype_byte_size``, ``convert_file_size_to_int``, ``named_module_tensors``,
``get_non_persistent_buffers``, ``compute_module_sizes``, ``compute_module_total_buffer_size``,
``find_tied_parameters``, ``retie_parameters``, ``get_module_size_with_ties`` and ``get_max_layer_size``.
"""

from __future__ import annotations

import enum
import re
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from x_common.dtypes import dtype_bits

__all__ = [
    "CustomDtype",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "find_tied_parameters",
    "get_max_layer_size",
    "get_module_size_with_ties",
    "get_non_persistent_buffers",
    "named_module_tensors",
    "retie_parameters",
]


class CustomDtype(enum.Enum):
    """Accelerate's names for the sub-byte and 8-bit formats a planner may be asked to size weights in.

    Accepted wherever a dtype is (``infer_auto_device_map(dtype=CustomDtype.INT4)``), as its value.

    Examples:
        >>> from x_common.dtypes import dtype_bits
        >>> CustomDtype.INT4.value, dtype_bits(CustomDtype.INT4)
        ('int4', 4)
    """

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"


_ONE_BYTE = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
_UNITS = {"GIB": 2**30, "MIB": 2**20, "KIB": 2**10, "GB": 10**9, "MB": 10**6, "KB": 10**3}


def dtype_byte_size(dtype: torch.dtype | enum.Enum) -> float:
    """Bytes per element as Accelerate counts them: ``torch.bool`` is 1/8, every fp8 dtype 1, and a
    ``CustomDtype`` its width (``INT4`` 1/2, ``INT2`` 1/4, ``FP8`` 1).

    Examples:
        >>> dtype_byte_size(CustomDtype.INT4), dtype_byte_size(CustomDtype.FP8)
        (0.5, 1)
        >>> dtype_byte_size(torch.bool), dtype_byte_size(torch.bfloat16), dtype_byte_size(torch.float32)
        (0.125, 2, 4)

    Raises:
        ValueError: a dtype without a bit width in its name.
    """
    if isinstance(dtype, enum.Enum) and isinstance(dtype.value, str):
        width = dtype_bits(dtype.value)
        return width // 8 if width % 8 == 0 else width / 8
    if dtype == torch.bool:
        return 1 / 8
    if any(getattr(torch, name, None) == dtype for name in _ONE_BYTE):
        return 1
    bits = re.search(r"[^\d](\d+)$", str(dtype))
    if bits is None:
        raise ValueError(f"`dtype` is not a valid dtype: {dtype}.")
    return int(bits.group(1)) // 8


def convert_file_size_to_int(size: int | str) -> int:
    """Bytes in ``size``: an int, or a string such as ``"5GB"`` (10**9), ``"2GiB"`` (2**30), ``"8Mb"`` (bits).

    Examples:
        >>> convert_file_size_to_int("100MB"), convert_file_size_to_int("2GiB"), convert_file_size_to_int("8Mb")
        (100000000, 2147483648, 1000000)

    Raises:
        ValueError: anything else (the message says what is accepted).
    """
    problem = (
        f"`size` {size} is not in a valid format. Use an integer for bytes, or a string with an unit (like '5.0GB')."
    )
    if isinstance(size, int):
        if size < 0:
            raise ValueError(problem)
        return size
    for unit, scale in _UNITS.items():
        if str(size).upper().endswith(unit):
            try:
                count = int(float(size[: -len(unit)]) * scale)
            except ValueError:
                raise ValueError(problem) from None
            # "Gb"/"Mb"/"kb": bits, as Accelerate reads a lower-case b.
            value = count // 8 if not unit.endswith("IB") and size.endswith("b") else count
            if value < 0:
                raise ValueError(problem)
            return value
    raise ValueError(problem)


def named_module_tensors(
    module: nn.Module, include_buffers: bool = True, recurse: bool = False, remove_non_persistent: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for the parameters, then the buffers (less the non-persistent ones if asked)."""
    yield from module.named_parameters(recurse=recurse)
    if include_buffers:
        skipped = get_non_persistent_buffers(module, recurse=recurse) if remove_non_persistent else set()
        yield from ((name, b) for name, b in module.named_buffers(recurse=recurse) if name not in skipped)


def get_non_persistent_buffers(module: nn.Module, recurse: bool = False, fqns: bool = False) -> set[str]:
    """Names of the buffers registered with ``persistent=False`` (dotted from ``module`` with ``fqns``)."""
    names = set(module._non_persistent_buffers_set)
    if recurse:
        for prefix, child in module.named_modules():
            names |= {
                f"{prefix}.{b}" if fqns else b for b in child._non_persistent_buffers_set
            }  # ".b" at the root, as Accelerate
    return names


def _dtype(value: str | torch.dtype | enum.Enum) -> torch.dtype | enum.Enum:
    if isinstance(value, str):
        found = getattr(torch, value.replace("torch.", ""))
        assert isinstance(found, torch.dtype), value
        return found
    return value


def compute_module_sizes(
    model: nn.Module,
    dtype: str | torch.dtype | None = None,
    special_dtypes: dict[str, str | torch.dtype] | None = None,
    buffers_only: bool = False,
) -> defaultdict[str, int]:
    """Bytes per module name (``""`` the whole model) and per tensor, as Accelerate's counts them.

    ``dtype``: the dtype weights will be loaded in (never above a tensor's own; integer and bool
    tensors keep theirs). ``special_dtypes``: per tensor name. A tied parameter counts once, in
    the first module that holds it.

    Examples:
        >>> sizes = compute_module_sizes(nn.Linear(3, 4))
        >>> sizes[""], sizes["weight"], sizes["bias"]
        (64, 48, 16)
    """
    size_of = dtype_byte_size(_dtype(dtype)) if dtype is not None else None
    special = {name: dtype_byte_size(_dtype(d)) for name, d in (special_dtypes or {}).items()}
    tensors = model.named_buffers(recurse=True) if buffers_only else named_module_tensors(model, recurse=True)
    sizes: defaultdict[str, int] = defaultdict(int)
    for name, tensor in tensors:
        own = dtype_byte_size(tensor.dtype)
        if name in special:
            per = special[name]
        elif size_of is None or str(tensor.dtype).startswith(("torch.uint", "torch.int", "torch.bool")):
            per = own
        else:
            per = min(size_of, own)
        size = tensor.numel() * per
        parts = name.split(".")
        for depth in range(len(parts) + 1):
            sizes[".".join(parts[:depth])] += size  # type: ignore[assignment]  # bool tensors: fractional bytes
    return sizes


def compute_module_total_buffer_size(
    model: nn.Module, dtype: str | torch.dtype | None = None, special_dtypes: dict[str, Any] | None = None
) -> int:
    """Bytes of all the model's buffers, counted as ``compute_module_sizes`` counts them."""
    return compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes, buffers_only=True).get("", 0)


def find_tied_parameters(model: nn.Module, **kwargs: Any) -> list[list[str]]:
    """Groups of parameter names that are one parameter, each group sorted (``[]`` when none are tied).

    Examples:
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
        >>> model[1].weight = model[0].weight
        >>> find_tied_parameters(model)
        [['0.weight', '1.weight']]
    """
    every = dict(model.named_parameters(remove_duplicate=False))
    first = dict(model.named_parameters())
    groups: dict[str, set[str]] = {}
    for name in set(every) - set(first):
        owner = next(kept for kept, param in first.items() if param is every[name])
        groups.setdefault(owner, set()).add(name)
    return [sorted([owner, *names]) for owner, names in groups.items()]


def retie_parameters(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Make each group of names one parameter again: the first of them not on the meta device."""
    for group in tied_params:
        holders = []
        for name in group:
            module_name, _, leaf = name.rpartition(".")
            holders.append((model.get_submodule(module_name), leaf))
        kept = next((getattr(m, leaf) for m, leaf in holders if getattr(m, leaf).device.type != "meta"), None)
        if kept is not None:
            for module, leaf in holders:
                setattr(module, leaf, kept)


def get_module_size_with_ties(
    tied_params: Sequence[str],
    module_size: int,
    module_sizes: Mapping[str, int],
    modules_to_treat: Sequence[tuple[str, nn.Module]],
) -> tuple[int, list[str], list[nn.Module]]:
    """The size of a module together with the modules still to place that hold its tied
    parameters ``tied_params``, each tied parameter counted once (Accelerate's planner's step).

    Returns:
        the size, and for each tied parameter (in order) the name and the module of the entry of
        ``modules_to_treat`` holding it.

    Raises:
        ValueError: a tied parameter is in none of ``modules_to_treat``.
    """
    names: list[str] = []
    modules: list[nn.Module] = []
    size = module_size
    for param in tied_params:
        holder = next(((n, m) for n, m in modules_to_treat if not n or param.startswith(f"{n}.")), None)
        if holder is None:
            raise ValueError(f"tied parameter {param} is in none of the modules still to place")
        names.append(holder[0])
        modules.append(holder[1])
        size += module_sizes[holder[0]] - module_sizes[param]
    return size, names, modules


def get_max_layer_size(
    modules: Sequence[tuple[str, nn.Module]], module_sizes: Mapping[str, int], no_split_module_classes: Sequence[str]
) -> tuple[int, list[str]]:
    """The largest layer among ``modules`` and the names of the layers of that size, in model order.

    A layer is a module that is not split further: one without children, or one whose class is in
    ``no_split_module_classes``; any other module is looked into. transformers' planner keeps room
    for this size on the device that runs the model.

    Examples:
        >>> block = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        >>> model = nn.Sequential(block, nn.Linear(4, 4))
        >>> sizes = compute_module_sizes(model)
        >>> get_max_layer_size(list(model.named_children()), sizes, [])
        (80, ['0.0', '1'])
        >>> get_max_layer_size(list(model.named_children()), sizes, ["Sequential"])
        (120, ['0'])
    """
    largest, names = 0, []
    pending = list(modules)
    while pending:
        name, module = pending.pop(0)
        children = list(module.named_children()) if isinstance(module, nn.Module) else []
        if children and type(module).__name__ not in no_split_module_classes:
            pending[:0] = [(f"{name}.{child}", sub) for child, sub in children]
            continue
        size = module_sizes[name]
        if size > largest:
            largest, names = size, [name]
        elif size == largest:
            names.append(name)
    return largest, names
