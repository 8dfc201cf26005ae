"""A copy of everything a checkpoint holds, taken in the calling thread, for an asynchronous save.

``save_state(async_save=True)`` returns once this copy exists: training may then change every
weight, moment and counter while a background thread writes the copy. Tensors are copied to
host memory (pinned where CUDA is used, so the copy out of the GPU runs at full speed), one copy
per storage, so tied weights stay tied and the files hold shared tensors once, as a synchronous
save's do. Everything else in the state dicts is deep-copied. The copy costs host memory equal
to the weights and optimizer state; ``HostBuffers`` keeps it for the next save, because writing
into freshly allocated memory (page faults, pinning) costs about as much again as the copy.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import torch

from x_runtime.checkpoint.parts import CheckpointParts
from x_runtime.core.offloaded import state_dict_of
from x_runtime.core.random_state import capture_rng_state
from x_runtime.strategies.base import Strategy

__all__ = ["HostBuffers", "copies_in_background", "snapshot_parts"]


def copies_in_background(strategy: Strategy) -> bool:
    """Whether ``strategy`` writes its files from plain state dicts, with no collective.

    Sharding strategies (FSDP, DeepSpeed) and XLA gather or stream their files with collectives
    or device work of their own; those saves stay synchronous. The strategy declares it
    (``Strategy.writes_from_state_dicts``).
    """
    return strategy.writes_from_state_dicts


class Frozen(torch.nn.Module):
    """Stands for a model, an optimizer or a stateful object: ``state_dict()`` gives the copy."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self._frozen = state
        self.param_groups: list[dict[str, Any]] = []  # as an optimizer: updates no model's parameters

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._frozen


class HostBuffers:
    """Host storages one snapshot copied into, lent again to the next (same sizes) once written."""

    def __init__(self) -> None:
        self._spare: dict[tuple[int, bool], list[torch.UntypedStorage]] = {}
        self._lent: list[tuple[tuple[int, bool], torch.UntypedStorage]] = []
        self._lock = threading.Lock()  # given back by the writer thread, taken by the calling one

    def take(self, nbytes: int, pinned: bool) -> torch.UntypedStorage:
        with self._lock:
            spare = self._spare.get((nbytes, pinned))
            storage = spare.pop() if spare else None
        if storage is None:
            storage = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned).untyped_storage()
        self._lent.append(((nbytes, pinned), storage))
        return storage

    def drop_spare(self) -> None:
        """Free what this snapshot did not reuse (the state's shapes changed)."""
        with self._lock:
            self._spare.clear()

    def give_back(self) -> None:
        """The write that read the lent storages is over: the next snapshot may copy into them."""
        with self._lock:
            for key, storage in self._lent:
                self._spare.setdefault(key, []).append(storage)
            self._lent = []


class _Copier:
    """Copies tensors to host memory once per storage, keeping views of one storage views of one copy."""

    def __init__(self, buffers: HostBuffers) -> None:
        self._storages: dict[tuple[str, int], torch.UntypedStorage] = {}
        self._pin = torch.cuda.is_available()
        self._buffers = buffers

    def tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.detach()
        if tensor.device.type not in ("cpu", "cuda") or tensor.is_sparse or tensor.is_meta:
            return tensor.to("cpu", copy=True)  # no storage to share (or none worth sharing)
        source = tensor.untyped_storage()
        key = (str(source.device), source.data_ptr())
        copied = self._storages.get(key)
        if copied is None:
            pinned = self._pin and source.device.type == "cuda"
            copied = self._buffers.take(source.nbytes(), pinned)
            copied.copy_(source)  # blocking: the copy is complete when save_state returns
            self._storages[key] = copied
        view = torch.empty(0, dtype=tensor.dtype)
        view.set_(copied, tensor.storage_offset(), tensor.size(), tensor.stride())
        return view

    def tree(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self.tensor(value)
        if isinstance(value, dict):
            return type(value)((key, self.tree(item)) for key, item in value.items())
        if isinstance(value, list | tuple) and not hasattr(value, "_fields"):
            return type(value)(self.tree(item) for item in value)
        return copy.deepcopy(value)  # numbers, strings, and whatever else a state dict holds


def snapshot_parts(parts: CheckpointParts, buffers: HostBuffers) -> CheckpointParts:
    """``parts`` with every object replaced by a copy of its state (calls ``state_dict`` here, now).

    ``parts.before_save`` must already have run (it chooses which models are written). The
    tensors are copied into storages taken from ``buffers``: give them back once written.
    """
    copier = _Copier(buffers)
    frozen = [Frozen(copier.tree(state_dict_of(model))) for model in parts.models]
    optimizers = [Frozen(copier.tree(optimizer.state_dict())) for optimizer in parts.optimizers]
    copied = CheckpointParts(
        models=list(frozen),
        optimizers=optimizers,
        schedulers=[Frozen(copier.tree(scheduler.state_dict())) for scheduler in parts.schedulers],
        dataloaders=[Frozen(copier.tree(loader.state_dict())) for loader in parts.dataloaders],
        custom=[Frozen(copier.tree(obj.state_dict())) for obj in parts.custom],
        scaler=Frozen(copier.tree(parts.scaler.state_dict())) if parts.scaler is not None else None,  # type: ignore[arg-type]
        strategy=parts.strategy,
        random_state=capture_rng_state(),
        step=parts.step,
    )
    buffers.drop_spare()
    return copied
