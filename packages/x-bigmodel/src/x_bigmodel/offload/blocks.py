"""A block of offloaded weights: brought onto the execution device for a forward, released after.

A block is the set of weights one hook manages (a decoder layer, a leaf module, or the tensors a
module holds directly). Between forwards its parameter slots hold meta tensors; ``fetch`` produces
the real tensors (on the prefetch thread or inline), ``install`` puts them in the slots, and
``release`` puts the meta tensors back and hands file pages back to the kernel. Weights that one
submodule alone uses (a decoder layer's ``q_proj``) can have their pages handed back as soon as that
submodule's forward ends (``leaf_groups``, ``finished``), before the block's forward does.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from x_bigmodel.devices.tensor_placement import assign_tensor, wrap_like
from x_bigmodel.offload.weights import FileWeight, MemoryWeight

__all__ = ["Fetched", "OffloadedBlock", "WeightGroup"]

Source = MemoryWeight | FileWeight

# Smaller weights (norms, biases) go back with the rest of the block: handing them back on their
# own would wake the release thread, and so interrupt the forward's threads, for next to nothing.
EARLY_MIN_BYTES = 2**20


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

    def discard(self, pages: Pages | None = None) -> None:
        # A prefetch that was not used: hand back the pages it faulted in.
        if not self.installed:
            self.block.release_sources(pages)


class Pages(Protocol):
    """Where file pages are mapped in and handed back through (``PageBudget``, which counts them)."""

    def map_in(self, source: Source, device: torch.device, hurry: threading.Event | None = None) -> None: ...
    def hand_back(self, source: Source, device: torch.device) -> None: ...


class OffloadedBlock:
    """The weights of one hooked module that live off the execution device between forwards."""

    def __init__(self, name: str, groups: list[WeightGroup], device: torch.device) -> None:
        self.name, self.groups, self.device = name, groups, device
        self.depth = 0  # nested or repeated calls of the module load the weights once
        self.leaves: dict[nn.Module, list[WeightGroup]] = {}  # handed back early: see leaf_groups
        self.handles: list[Any] = []  # the hooks on those submodules
        self._spent: set[int] = set()  # groups handed back early during this forward

    def __repr__(self) -> str:
        return f"OffloadedBlock({self.name!r}, {len(self.groups)} tensors, on {self.device})"

    def mapped_bytes(self) -> int:
        """The file pages a forward maps in for this block (weights used in place), in bytes."""
        sources = {id(g.source): g.source for g in self.groups}
        return sum(source.mapped_bytes(self.device) for source in sources.values())

    def fetch(
        self,
        ahead: bool = False,
        pages: Pages | None = None,
        hurry: threading.Event | None = None,
        stream: Any = None,
    ) -> Fetched:
        """The tensors on the execution device; ``ahead``: on the prefetch thread (on the
        prefetcher's side ``stream`` for CUDA), the pages mapped in through ``pages``, waiting for
        room unless ``hurry`` is set."""
        if not ahead or self.device.type != "cuda":
            if ahead:
                for group in self.groups:  # all of the block's reads start now, whatever waits
                    group.source.read_ahead(self.device)
            for group in self.groups:
                if pages is not None:
                    pages.map_in(group.source, self.device, hurry if ahead else None)
                else:
                    group.source.populate(self.device)
            return Fetched(self, [group.source.fetch(self.device) for group in self.groups])
        assert stream is not None, "a prefetch to a GPU copies on the prefetcher's side stream"
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
            live = wrap_like(group.template, value)
            for owner, leaf in group.slots:
                assign_tensor(owner, leaf, live)
        fetched.installed = True
        self._spent.clear()

    def release(self, pages: bool = True) -> None:
        """Put the meta tensors back in the slots, and the pages back unless ``pages`` is false
        (the caller hands them back, off the forward's thread)."""
        for group in self.groups:
            for owner, leaf in group.slots:
                assign_tensor(owner, leaf, group.template)
        if pages:
            self.release_sources()

    def release_sources(self, pages: Pages | None = None, groups: list[WeightGroup] | None = None) -> None:
        for group in self.groups if groups is None else groups:
            if pages is not None:
                pages.hand_back(group.source, self.device)
            else:
                group.source.release(self.device)

    def leaf_groups(self, own: nn.Module) -> dict[nn.Module, list[WeightGroup]]:
        """The groups (of ``EARLY_MIN_BYTES`` or more) whose every slot is on one submodule of the
        block's module ``own``, by that submodule: once its forward has run, the block's forward is
        done with them (a later read still works: it faults the pages in again)."""
        out: dict[nn.Module, list[WeightGroup]] = {}
        for group in self.groups:
            owners = {id(owner): owner for owner, _ in group.slots}
            if len(owners) == 1 and group.source.mapped_bytes(self.device) >= EARLY_MIN_BYTES:
                owner = next(iter(owners.values()))
                if owner is not own:
                    out.setdefault(owner, []).append(group)
        return out

    def hand_back_sizes(self) -> list[int]:
        """The bytes of file pages a forward hands back at once: each of ``leaves``' as it ends,
        then the rest when the block's forward ends."""
        early = {id(group) for groups in self.leaves.values() for group in groups}
        sizes = [sum(group.source.mapped_bytes(self.device) for group in groups) for groups in self.leaves.values()]
        rest = sum(group.source.mapped_bytes(self.device) for group in self.groups if id(group) not in early)
        return [*sizes, rest] if rest else sizes

    def finished(self, groups: list[WeightGroup]) -> list[WeightGroup]:
        """Of ``groups`` (a submodule's, whose forward just ended), those to hand back now: none
        outside the block's forward, each once per forward."""
        if self.depth == 0:
            return []
        fresh = [group for group in groups if id(group) not in self._spent]
        self._spent.update(id(group) for group in fresh)
        return fresh

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
            live = wrap_like(group.template, value)
            for owner, leaf in group.slots:
                assign_tensor(owner, leaf, live)

    def reset(self, pages: Pages | None = None) -> None:
        """Forget a forward that never finished (interrupted by ``KeyboardInterrupt``)."""
        if self.depth:
            self.depth = 0
            self.release(pages=False)
            self.release_sources(pages)

    def weights(self, prefix: str) -> dict[str, Source]:
        """The block's sources by name relative to module ``prefix`` (Accelerate's ``weights_map``)."""
        start = f"{prefix}." if prefix else ""
        return {n[len(start) :]: g.source for g in self.groups for n in g.names if n.startswith(start)}
