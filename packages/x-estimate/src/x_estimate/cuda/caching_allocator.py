"""A model of PyTorch's CUDA caching allocator, replayed over a simulated step's allocations.

``torch.cuda.max_memory_allocated`` counts the blocks the allocator hands out and
``max_memory_reserved`` the segments it took from the driver; a job runs out of memory when a
segment cannot be had, so the reserved figure is the one to plan with. The rules modelled are
those of ``c10/cuda/CUDACachingAllocator.cpp`` with default settings:

- every request is rounded up to a multiple of 512 bytes (at least 512);
- requests of at most 1 MiB come from the small pool, carved from 2 MiB segments; larger ones
  from the large pool, whose new segments are 20 MiB for requests under 10 MiB and the request
  rounded up to 2 MiB above that;
- a request takes the smallest free block of its pool that holds it (best fit) and splits off
  the rest when the rest is at least 512 bytes (small pool) or more than 1 MiB (large pool);
  an unsplit block is counted whole as allocated;
- a freed block merges with free neighbours of its segment; segments are never given back
  (``empty_cache`` is not called in a training loop, and out-of-memory retries are not modelled).

It is an approximation: one stream (the autograd engine reuses the forward's stream), no
``expandable_segments``, no ``max_split_size_mb``, and addresses assigned in the order the
simulation allocates, which is the order of the real step.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["AllocatorPeaks", "CachingAllocator", "block_size"]

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20  # at most this: the small pool
SMALL_SEGMENT = 2 << 20
LARGE_SEGMENT = 20 << 20  # for large requests under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def block_size(nbytes: int) -> int:
    """The bytes a request of ``nbytes`` occupies: rounded up to 512, at least 512.

    Examples:
        >>> block_size(1), block_size(4096), block_size(4097)
        (512, 4096, 4608)
    """
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


def _segment_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-size // ROUND_LARGE) * ROUND_LARGE


@dataclass(frozen=True)
class AllocatorPeaks:
    allocated: int  # the most bytes in blocks handed out at once
    reserved: int  # segments held at the end (they are never given back)


class CachingAllocator:
    """Best-fit blocks in 2 MiB / 20 MiB / rounded segments, split and merged as CUDA's allocator does.

    Examples:
        >>> a = CachingAllocator()
        >>> x = a.malloc(3 << 20)  # a 20 MiB segment, split
        >>> a.free(x); y = a.malloc(5 << 20)  # reuses the same segment
        >>> a.reserved >> 20, a.peak_allocated >> 20
        (20, 5)
    """

    def __init__(self) -> None:
        self.allocated = self.peak_allocated = self.reserved = 0
        self._top = 0  # next segment's address
        self._free: dict[bool, list[tuple[int, int]]] = {True: [], False: []}  # small? -> sorted (size, addr)
        self._blocks: dict[int, list[int]] = {}  # addr -> [size, free (0/1), segment id, small (0/1)]
        self._ends: dict[int, int] = {}  # end address -> start address, to find a block's left neighbour

    def malloc(self, nbytes: int) -> int:
        size = block_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._free[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i < len(pool):
            bsize, addr = pool.pop(i)
        else:
            bsize, addr = _segment_size(size), self._top
            self._top += bsize
            self.reserved += bsize
            self._set(addr, bsize, 1, addr, small)
        seg = self._blocks[addr][2]
        rest = bsize - size
        if rest >= MIN_BLOCK if small else rest > SMALL_SIZE:
            self._set(addr + size, rest, 1, seg, small)
            bisect.insort(pool, (rest, addr + size))
            bsize = size
        self._set(addr, bsize, 0, seg, small)
        self.allocated += bsize
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return addr

    def free(self, addr: int) -> None:
        size, _, seg, small = self._blocks[addr]
        self.allocated -= size
        pool = self._free[bool(small)]
        right = self._blocks.get(addr + size)
        if right is not None and right[1] and right[2] == seg:  # merge the free block after it
            pool.remove((right[0], addr + size))
            del self._blocks[addr + size], self._ends[addr + size + right[0]]
            self._ends.pop(addr + size, None)
            size += right[0]
        left_addr = self._ends.get(addr)
        left = None if left_addr is None else self._blocks[left_addr]
        if left_addr is not None and left is not None and left[1] and left[2] == seg:  # and the one before
            pool.remove((left[0], left_addr))
            del self._blocks[addr], self._ends[addr]
            addr, size = left_addr, size + left[0]
        self._set(addr, size, 1, seg, bool(small))
        bisect.insort(pool, (size, addr))

    def _set(self, addr: int, size: int, free: int, seg: int, small: bool) -> None:
        old = self._blocks.get(addr)
        if old is not None and self._ends.get(addr + old[0]) == addr:
            del self._ends[addr + old[0]]
        self._blocks[addr] = [size, free, seg, int(small)]
        self._ends[addr + size] = addr


def replay(events: Iterable[tuple[int, int, int]], again: Iterable[tuple[int, int, int]] = ()) -> AllocatorPeaks:
    """Peaks of the allocator over ``events`` ((+1 / -1, key, bytes), in order), then ``again``.

    ``again``: a training step replayed after ``events`` (the loop's start), as a second step
    meets the segments the first left. The allocated peak is the last pass's; the reserved
    figure is what is held at the end (segments are never given back).
    """
    allocator = CachingAllocator()
    addrs: dict[tuple[int, int], int] = {}
    passes = [(0, list(events))] + ([(1, again)] if (again := list(again)) else [])
    for round_, chunk in passes:
        allocator.peak_allocated = allocator.allocated
        for sign, key, nbytes in chunk:
            if sign > 0:
                addrs[round_, key] = allocator.malloc(nbytes)
            elif (round_, key) in addrs:
                allocator.free(addrs.pop((round_, key)))
    return AllocatorPeaks(allocator.peak_allocated, allocator.reserved)
