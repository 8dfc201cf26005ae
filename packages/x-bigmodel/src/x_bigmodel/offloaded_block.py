"""A block of offloaded weights: brought onto the execution device for a forward, released after.

A block is the set of weights one hook manages (a decoder layer, a leaf module, or the tensors a
module holds directly). Between forwards its parameter slots hold meta tensors; ``fetch`` produces
the real tensors (on the prefetch thread or inline), ``install`` puts them in the slots, and
``release`` puts the meta tensors back and hands file pages back to the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from x_bigmodel.offload_weights import FileWeight, MemoryWeight
from x_bigmodel.tensor_placement import _assign, _wrap_like

__all__ = ["Fetched", "OffloadedBlock", "WeightGroup"]

Source = MemoryWeight | FileWeight


@dataclass
class WeightGroup:
    """One tensor, reachable under one or more (module, attribute) slots (tied weights)."""

    names: list[str]
    slots: list[tuple[nn.Module, str]]
    template: torch.Tensor  # what the slots hold between forwards: a meta tensor of the right class
    source: Source
    original_device: torch.device | None = None  # where it was before dispatch (None: on meta)


@dataclass
class Fetched:
    """A block's tensors on the execution device, and the CUDA event their copies finish at."""

    block: OffloadedBlock
    values: list[torch.Tensor]
    event: Any = None
    installed: bool = field(default=False)

    def discard(self) -> None:
        # A prefetch that was not used: hand back the pages it faulted in.
        if not self.installed:
            self.block.release_sources()


class OffloadedBlock:
    """The weights of one hooked module that live off the execution device between forwards."""

    def __init__(self, name: str, groups: list[WeightGroup], device: torch.device) -> None:
        self.name, self.groups, self.device = name, groups, device
        self.depth = 0  # nested or repeated calls of the module load the weights once

    def __repr__(self) -> str:
        return f"OffloadedBlock({self.name!r}, {len(self.groups)} tensors, on {self.device})"

    def fetch(self, ahead: bool = False) -> Fetched:
        """The tensors on the execution device; ``ahead``: on the prefetch thread, on a side stream."""
        if not ahead or self.device.type != "cuda":
            for group in self.groups:
                group.source.populate(self.device)
            return Fetched(self, [group.source.fetch(self.device) for group in self.groups])
        stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(stream):
            values = [group.source.fetch(self.device) for group in self.groups]
            event = torch.cuda.Event()
            event.record(stream)
        return Fetched(self, values, event)

    def install(self, fetched: Fetched) -> None:
        if fetched.event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(fetched.event)
            for value in fetched.values:
                value.record_stream(current)  # made on the side stream, used and freed on this one
        for group, value in zip(self.groups, fetched.values, strict=True):
            live = _wrap_like(group.template, value)
            for owner, leaf in group.slots:
                _assign(owner, leaf, live)
        fetched.installed = True

    def release(self) -> None:
        for group in self.groups:
            for owner, leaf in group.slots:
                _assign(owner, leaf, group.template)
        self.release_sources()

    def release_sources(self) -> None:
        for group in self.groups:
            group.source.release(self.device)

    def restore(self) -> None:
        """Put the weights back in their slots for good, where they were before dispatch (when the
        hook is removed); weights that were on meta then stay on meta."""
        for group in self.groups:
            if isinstance(group.source, MemoryWeight):
                value = group.source.tensor
            elif group.original_device is not None:
                value = group.source.file.read(group.source.key).to(group.original_device, group.source.dtype)
            else:
                continue
            live = _wrap_like(group.template, value)
            for owner, leaf in group.slots:
                _assign(owner, leaf, live)

    def reset(self) -> None:
        """Forget a forward that never finished (interrupted by ``KeyboardInterrupt``)."""
        if self.depth:
            self.depth = 0
            self.release()

    def weights(self, prefix: str) -> dict[str, Source]:
        """The block's sources by name relative to module ``prefix`` (Accelerate's ``weights_map``)."""
        start = f"{prefix}." if prefix else ""
        return {n[len(start) :]: g.source for g in self.groups for n in g.names if n.startswith(start)}
