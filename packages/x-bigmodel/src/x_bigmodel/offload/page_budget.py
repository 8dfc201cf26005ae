"""A bound on the file pages of offloaded weights mapped into the process at once.

Disk-offloaded weights used in place by a CPU forward are the file's pages, mapped in before the
block's forward and handed back after (``FileWeight.populate`` / ``release``). The prefetch thread
maps the next block in while the current one computes; unbounded, memory would hold both blocks
whole. Here the prefetch maps each weight in only once the pages mapped in stay within ``limit``
(the ``Prefetcher`` sets the largest block plus its largest weight): the current block hands its
weights back one by one as its submodules finish, and the next block's come in behind them, so
resident memory holds about one block, not two.

Only the prefetch ever waits. The forward itself maps in what it needs at once, and when it needs
the block being prefetched, it says so (``hurry``) and the prefetch stops waiting: the bound gives
way rather than the forward stalling (a block nested in another, or a forward that re-reads
weights it already handed back). The wait also ends when the budget is closed.
"""

from __future__ import annotations

import threading
from typing import Protocol

import torch

__all__ = ["PageBudget"]


class PagedSource(Protocol):
    def mapped_bytes(self, device: torch.device) -> int: ...
    def populate(self, device: torch.device) -> None: ...
    def release(self, device: torch.device) -> None: ...


class PageBudget:
    """Counts the bytes of each source mapped in (once per source, however often it is brought in)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._used = 0
        self._mapped: dict[int, int] = {}
        self._cond = threading.Condition()
        self._closed = False

    @property
    def used(self) -> int:
        return self._used

    def map_in(self, source: PagedSource, device: torch.device, hurry: threading.Event | None = None) -> None:
        """Map ``source``'s pages in; with ``hurry`` (the prefetch), first wait until they fit the
        limit, with nothing else mapped, or until ``hurry`` is set."""
        nbytes = source.mapped_bytes(device)
        if nbytes:
            with self._cond:
                if id(source) not in self._mapped:
                    while hurry is not None and self._used and self._used + nbytes > self.limit:
                        if hurry.is_set() or self._closed:
                            break
                        self._cond.wait()  # for a hand-back, a hurry (``wake``) or a close
                    self._used += nbytes
                    self._mapped[id(source)] = nbytes
        source.populate(device)

    def hand_back(self, source: PagedSource, device: torch.device) -> None:
        """Drop ``source``'s pages from the process (they stay in the page cache) and count them out."""
        source.release(device)
        with self._cond:
            self._used -= self._mapped.pop(id(source), 0)
            self._cond.notify_all()

    def wake(self) -> None:
        """Have waiting prefetches look again (after a ``hurry`` was set)."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
