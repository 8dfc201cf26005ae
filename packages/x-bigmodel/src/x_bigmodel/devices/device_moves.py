"""Moving a forward's inputs and outputs between devices: tensors inside tuples, lists and mappings.

Only tensors move. Anything else (a transformers ``Cache``, a config, ``None``) is passed through
as the same object, and a container whose tensors are all in place already is returned as is, so
objects updated in place by the model (a KV cache) stay the caller's objects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any, cast

import torch

__all__ = ["find_device", "send_to_device"]


def send_to_device(obj: Any, device: torch.device, skip_keys: Collection[str] = ()) -> Any:
    """``obj`` with its tensors on ``device``; mapping entries named in ``skip_keys`` are left alone.

    Examples:
        >>> batch = {"ids": torch.ones(2, dtype=torch.long), "cache": None}
        >>> send_to_device(batch, torch.device("meta"))["ids"].device.type
        'meta'
    """
    moved, _ = _move(obj, device, skip_keys)
    return moved


def find_device(obj: Any) -> torch.device | None:
    """The device of the first tensor in ``obj`` (depth first), or ``None`` when it holds none."""
    if isinstance(obj, torch.Tensor):
        return obj.device
    if isinstance(obj, Mapping):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        for item in obj:
            found = find_device(item)
            if found is not None:
                return found
    return None


def _move(obj: Any, device: torch.device, skip_keys: Collection[str]) -> tuple[Any, bool]:
    if isinstance(obj, torch.Tensor):
        if obj.device == device:
            return obj, False
        # Asynchronous only towards an accelerator: a copy to the host must be complete on return.
        return obj.to(device, non_blocking=device.type != "cpu"), True
    if isinstance(obj, (list, tuple)):
        items = [_move(item, device, skip_keys) for item in obj]
        if not any(changed for _, changed in items):
            return obj, False
        values = [value for value, _ in items]
        if isinstance(obj, list):
            return (values if type(obj) is list else type(obj)(values)), True
        if hasattr(obj, "_fields"):  # a namedtuple
            return type(obj)(*values), True
        return (tuple(values) if type(obj) is tuple else type(obj)(values)), True
    if isinstance(obj, Mapping):
        changes = {}
        for key, value in obj.items():
            if key in skip_keys:
                continue
            new, changed = _move(value, device, skip_keys)
            if changed:
                changes[key] = new
        if not changes:
            return obj, False
        if type(obj) is dict:
            return {**obj, **changes}, True
        if dataclasses.is_dataclass(obj):  # e.g. transformers' ModelOutput
            return dataclasses.replace(obj, **changes), True
        try:
            # The Mapping subclass's constructor is unknown; one that refuses a dict raises TypeError.
            return cast(Any, type(obj))({**obj, **changes}), True
        except TypeError:
            return {**obj, **changes}, True
    return obj, False
