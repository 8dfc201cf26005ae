"""Debug mode: before a collective, every process checks that the shapes it is about to send agree.

On (``X_DEBUG_MODE=1``, set by ``x-launch --debug``, or ``ACCELERATE_DEBUG_MODE``;
``set_debug_mode`` / ``PartialState.debug = True``; or ``debug=True`` on a collective), ``reduce``, ``broadcast``, ``gather_object`` and ``broadcast_object_list`` first
exchange a description of their input (one pickled ``all_gather_object``). When the processes
disagree, every one of them raises the same :class:`DistributedOperationException` naming each
process's shapes, instead of a backend crash (gloo aborts the process on a size mismatch) or a
silent wrong result. ``gather`` and ``pad_across_processes`` check their shapes always.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from x_runtime.core.nested import is_namedtuple
from x_runtime.process.collectives.errors import DistributedOperationException

__all__ = ["DistributedOperationException", "debug_mode", "set_debug_mode", "verify_operation"]

# The switch belongs to the process group the collectives run over (the free functions have no
# accelerator to hold it): it ends with the group, so nothing outlives a job or needs resetting.
_switched: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
# What the launch settings said when the process state was built (X_DEBUG_MODE, read once with
# the rest): for the group it joined, and for the process (a world of one has no group).
_from_settings: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_process_setting = [False]


def set_debug_default(on: bool) -> None:
    """The launch settings' debug mode (``ProcessState`` sets it once it has joined its group)."""
    _process_setting[0] = bool(on)
    group = _default_group()
    if group is not None:
        _from_settings[group] = bool(on)


def set_debug_mode(on: bool | None) -> None:
    """Debug mode on or off for collectives over the current process group; ``None``: as ``X_DEBUG_MODE`` says.

    Without a process group there is nothing to check (a world of one), and the call does nothing.
    """
    group = _default_group()
    if group is None:
        return
    if on is None:
        _switched.pop(group, None)
    else:
        _switched[group] = bool(on)


def _default_group() -> Any:
    return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None


def debug_mode(explicit: bool | None = None) -> bool:
    """Whether collectives check shapes first: ``explicit``, else ``set_debug_mode``, else the launch settings'.

    The settings' ``X_DEBUG_MODE`` is the one read when the process state was built (an
    ``Accelerator``, ``PartialState``), not the environment at the time of the call.

    Examples:
        >>> debug_mode(True), debug_mode(False)
        (True, False)
    """
    if explicit is not None:
        return bool(explicit)
    group = _default_group()
    if group is not None and group in _switched:
        return _switched[group]
    if group is not None and group in _from_settings:
        return _from_settings[group]
    return _process_setting[0]


def describe(data: Any) -> Any:
    """``data`` with every tensor replaced by its shape as a list (Accelerate's ``get_shape``).

    Examples:
        >>> describe({"x": torch.zeros(2, 3), "n": [torch.tensor(1.0)]})
        {'x': [2, 3], 'n': [[]]}
    """
    if isinstance(data, torch.Tensor):
        return list(data.shape)
    if is_namedtuple(data):
        return type(data).__name__, [describe(item) for item in data]
    if isinstance(data, (list, tuple)):
        return type(data)(describe(item) for item in data)
    if isinstance(data, Mapping):
        return {key: describe(value) for key, value in data.items()}
    return type(data).__name__


def verify_operation(op: str, data: Any, *, key: Callable[[Any], Any] = describe, group: Any = None) -> None:
    """Raise :class:`DistributedOperationException` on every process unless ``key(data)`` agrees.

    Every process of the default group must call it (one ``all_gather_object``). ``key`` maps
    the input to what must be equal across processes (by default the nested shapes); ``op``
    must be equal too, so a process that entered a different collective is caught as well. The
    message lists every process's shapes, as Accelerate's ``verify_operation`` does.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    gathered: list[Any] = [None] * dist.get_world_size()
    # The operation's name travels too: a process in another collective's check disagrees as well.
    dist.all_gather_object(gathered, ((op, key(data)), describe(data)), group=group)
    if all(entry[0] == gathered[0][0] for entry in gathered):
        return
    lines = "\n  - ".join(f"Process {r}: {entry[1]}" for r, entry in enumerate(gathered))
    raise DistributedOperationException(
        f"Cannot apply desired operation due to shape mismatches. All shapes across devices must be valid."
        f"\n\nOperation: `{op}`\nInput shapes:\n  - {lines}"
    )
