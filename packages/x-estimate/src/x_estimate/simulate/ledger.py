"""A ledger of tensor storages: every allocation an op makes, when it is freed, and the peak.

A ``TorchDispatchMode`` sees the outputs of every aten op (forward, backward and optimizer
alike, since autograd and the optimizer both dispatch through it). A storage not seen before is
an allocation; a weak reference with a callback tells when the last tensor holding it dies.
Views and in-place ops reuse a storage and cost nothing, as in the real allocator. Each live
storage carries a phase label (what the step was doing when it was allocated) and the shape of
the tensor that first held it, so the peak can be broken down afterwards.

The ledger keeps an event log rather than copying the live set at every new peak: replaying the
log up to the peak's position gives the live set there, in one pass at the end.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["Allocation", "Ledger"]


@dataclass(frozen=True)
class Allocation:
    """One storage: its bytes, the phase that allocated it and the first shape that held it."""

    key: int
    nbytes: int
    phase: str
    shape: tuple[int, ...]


class Ledger(TorchDispatchMode):
    """Counts live storage bytes through the ops dispatched while it is active.

    Examples:
        >>> with Ledger() as ledger:
        ...     a = torch.ones(1024)  # 4 KiB
        ...     b = a * 2  # 4 KiB more
        ...     del b
        >>> ledger.peak, ledger.live
        (8192, 4096)
    """

    def __init__(self, *, block: int = 1) -> None:
        super().__init__()
        self.block = block  # CUDA's allocator hands out multiples of 512 bytes: a storage costs that
        self.phase = "setup"  # the step sets this as it goes: forward, backward, optimizer...
        self.live = 0
        self.peak = 0
        self._next_key = 0
        self._alive: dict[int, Allocation] = {}
        self._refs: dict[int, _KeyedRef] = {}  # id(storage) -> weak reference, while alive
        self._events: list[tuple[int, Allocation, str]] = []  # (+1 allocated / -1 freed, what, phase then)
        self._peak_at = 0  # the events up to here give the live set at the peak

    def track(self, tensors: Any, phase: str) -> None:
        """Count tensors created outside the mode (weights built before it, inputs)."""
        for t in tree_leaves(tensors):
            if isinstance(t, torch.Tensor):
                self._see(t, phase)

    def key_of(self, tensor: torch.Tensor) -> int | None:
        """The ledger's key for ``tensor``'s storage, None when it is not live in the ledger."""
        ref = self._refs.get(id(tensor.untyped_storage()))
        return None if ref is None else ref.key

    def at_peak(self) -> list[Allocation]:
        """The storages live at the peak."""
        live: dict[int, Allocation] = {}
        for sign, alloc, _ in self._events[: self._peak_at]:
            if sign > 0:
                live[alloc.key] = alloc
            else:
                live.pop(alloc.key, None)
        return list(live.values())

    def alive(self) -> list[Allocation]:
        return list(self._alive.values())

    def events(self) -> list[tuple[int, Allocation, str]]:
        """Every allocation (+1) and free (-1), in order, with the phase it happened in."""
        return list(self._events)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._see(t, self.phase)
        return out

    def _see(self, tensor: torch.Tensor, phase: str) -> None:
        storage = tensor.untyped_storage()
        sid = id(storage)
        if sid in self._refs:
            return
        nbytes = storage.nbytes()
        nbytes = -(-nbytes // self.block) * self.block if nbytes else 0
        key = self._next_key
        self._next_key += 1
        alloc = Allocation(key, nbytes, phase, tuple(tensor.shape))

        def freed(_ref: Any, sid: int = sid, alloc: Allocation = alloc) -> None:
            self._refs.pop(sid, None)
            self._alive.pop(alloc.key, None)
            self.live -= alloc.nbytes
            self._events.append((-1, alloc, self.phase))

        self._refs[sid] = _KeyedRef(weakref.ref(storage, freed), key)
        self._alive[key] = alloc
        self.live += nbytes
        self._events.append((1, alloc, self.phase))
        if self.live > self.peak:
            self.peak = self.live
            self._peak_at = len(self._events)


class _KeyedRef:
    __slots__ = ("key", "ref")

    def __init__(self, ref: Any, key: int) -> None:
        self.ref, self.key = ref, key
