"""Optimizers built before ``prepare`` follow their parameters when a strategy replaces them.

FSDP's ``fully_shard`` swaps every parameter for a sharded one, and ``Module.to`` onto an XLA
device creates new ``Parameter`` objects (XLA tensors cannot share a CPU tensor's storage), so an
optimizer made from ``model.parameters()`` beforehand would step tensors the model no longer
uses, silently. Old parameters are held by weak reference, so an id recycled after one is freed
never matches.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch

__all__ = ["ParameterMoves"]


class ParameterMoves:
    """Which parameter replaced which, for repointing optimizers."""

    def __init__(self) -> None:
        self._moved: dict[int, tuple[weakref.ref[torch.nn.Parameter], torch.nn.Parameter]] = {}

    def record(self, before: Iterable[torch.nn.Parameter], after: Iterable[torch.nn.Parameter]) -> None:
        """``before`` and ``after``: one model's parameters, in the same order, around the change."""
        for old, new in zip(before, after, strict=True):
            if old is not new:
                self._moved[id(old)] = (weakref.ref(old), new)

    def move(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """``model.to(device)``, recorded, with shared (tied) parameters still shared afterwards.

        ``Module.to`` onto a device whose tensors cannot share a CPU tensor's storage (XLA) makes a
        new ``Parameter`` per module holding one: an LM head would come apart from its embedding.
        """
        owners: dict[int, list[tuple[torch.nn.Module, str]]] = {}
        for module in model.modules():
            for key, param in module._parameters.items():
                if param is not None:
                    owners.setdefault(id(param), []).append((module, key))
        before = list(model.parameters())
        model = model.to(device)
        for old in before:
            (first, first_key), *others = owners[id(old)]
            for module, key in others:
                module._parameters[key] = first._parameters[first_key]
        self.record(before, model.parameters())
        return model

    def repoint(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        for group in optimizer.param_groups:
            group["params"] = [self._current(p) for p in group["params"]]
        return optimizer

    def _current(self, param: torch.nn.Parameter) -> torch.nn.Parameter:
        entry = self._moved.get(id(param))
        if entry is not None and entry[0]() is param:
            return entry[1]
        return param
