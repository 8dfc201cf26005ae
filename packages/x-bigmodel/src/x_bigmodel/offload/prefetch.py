"""Fetching the next offloaded block's weights on a background thread while the current one runs,
and handing finished weights' pages back on another.

Which block comes next is learned: the first forward assumes model order (and that the first
block follows the last, as in generation loops), and every forward records the order blocks
actually ran in, so models that run blocks out of registration order (a tied LM head using the
embedding, an encoder-decoder) are predicted right from their second step on. At most one block
is fetched ahead.

For weights used in place from their files (a CPU forward over disk-offloaded weights), memory is
bounded by a ``PageBudget`` of about one block (see ``_limit``): the next block's reads start at
once (into the page cache, which is not the process's memory), but its pages are mapped in only as
the current block's submodules finish and hand theirs back, so resident memory holds about one
block, not two. Handing pages back (``madvise(MADV_DONTNEED)``) runs on its own thread, off the
forward's.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import Future
from typing import Any

import torch

from x_bigmodel.offload.blocks import Fetched, OffloadedBlock, WeightGroup
from x_bigmodel.offload.job_thread import JobThread
from x_bigmodel.offload.page_budget import PageBudget

__all__ = ["Prefetcher"]

_Pending = tuple[OffloadedBlock, "Future[Fetched]", threading.Event]


class Prefetcher:
    """Hands each block its weights, fetching the predicted next block's in the background."""

    def __init__(self, blocks: list[OffloadedBlock], enabled: bool = True) -> None:
        self._order = {id(block): index for index, block in enumerate(blocks)}
        self._blocks = blocks
        self._next: dict[int, OffloadedBlock] = {}
        self._previous: OffloadedBlock | None = None
        self._pending: _Pending | None = None
        self.enabled = enabled and len(blocks) > 1
        self._executor: JobThread | None = None
        self._releaser: JobThread | None = None
        self._released: Future[None] | None = None  # the latest hand-back (they run in order)
        self.pages = PageBudget(_limit(blocks))
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()
        # One side stream per device for every prefetch: the CUDA caching allocator reuses freed
        # memory only on the stream that allocated it, so a new stream per fetch (torch hands them
        # out round-robin from a pool of 32) would keep up to 32 blocks' weights reserved.
        self._streams: dict[torch.device, Any] = {}

    def acquire(self, block: OffloadedBlock) -> Fetched:
        """``block``'s weights, from the prefetch when it was predicted, else fetched now."""
        with self._lock:
            if self._pid != os.getpid():
                # A forked child: the parent's threads do not exist here (nor may its locks be free).
                self._pid, self._executor, self._releaser, self._pending = os.getpid(), None, None, None
                self._released, self.pages, self._streams = None, PageBudget(self.pages.limit), {}
            if self._previous is not None and self._previous is not block:
                self._next[id(self._previous)] = block
            self._previous = block
            pending, self._pending = self._pending, None
            released = self._released
        ready = pending is not None and pending[0] is block and pending[1].done()
        if released is not None and not ready:
            # What is still being handed back goes first, so that what comes in now (the rest of
            # the prefetch, or the block itself) stays within the budget. Rarely a wait: the
            # hand-backs run while the block before computes.
            released.result()
        fetched = None
        if pending is not None:
            pending[2].set()  # needed now (or not at all): the prefetch no longer waits for room
            self.pages.wake()
            if pending[0] is block:
                fetched = pending[1].result()
            else:
                self._drop(pending[1])
        if fetched is None:
            fetched = block.fetch(pages=self.pages)
        if self.enabled and not self._closed:
            following = self._predict(block)
            if following is not block:
                self._schedule(following)
        return fetched

    def release(self, block: OffloadedBlock, groups: list[WeightGroup] | None = None) -> None:
        """Hand back the pages of ``block``'s ``groups`` on the release thread; by default all of
        them, once the meta tensors are back in its slots (the block's forward has ended)."""
        if groups is None:
            block.release(pages=False)
        with self._lock:
            inline = not self.enabled or self._closed or self._pid != os.getpid()
            if not inline:
                if self._releaser is None:
                    self._releaser = JobThread("x-bigmodel-release")
                self._released = self._releaser.submit(block.release_sources, self.pages, groups)
        if inline:
            block.release_sources(self.pages, groups)

    def close(self) -> None:
        """Stop prefetching for good (hooks still running fetch their weights inline)."""
        with self._lock:
            self._closed = True
            pending, self._pending = self._pending, None
            executors = [self._executor, self._releaser]
            self._executor = self._releaser = None
        self.pages.close()
        if pending is not None:
            self._drop(pending[1])
        for executor in executors:
            if executor is not None:
                executor.shutdown()

    def _predict(self, block: OffloadedBlock) -> OffloadedBlock:
        learned = self._next.get(id(block))
        if learned is not None:
            return learned
        return self._blocks[(self._order[id(block)] + 1) % len(self._blocks)]

    def _schedule(self, block: OffloadedBlock) -> None:
        hurry = threading.Event()
        with self._lock:
            if self._executor is None:
                self._executor = JobThread("x-bigmodel-prefetch")
            released = self._released
            self._pending = (block, self._executor.submit(self._fetch_ahead, block, released, hurry), hurry)

    def _fetch_ahead(self, block: OffloadedBlock, released: Future[None] | None, hurry: threading.Event) -> Fetched:
        if released is not None:
            released.result()  # a hand-back still queued would drop the pages brought in here
        stream = None
        if block.device.type == "cuda":
            stream = self._streams.get(block.device)
            if stream is None:
                stream = self._streams[block.device] = torch.cuda.Stream(block.device)
        return block.fetch(True, self.pages, hurry, stream)

    def _drop(self, future: Future[Fetched]) -> None:
        if future.cancel():
            return
        # The block was not needed: its fetch error, if any, is not this forward's.
        with contextlib.suppress(Exception):
            future.result().discard(self.pages)


def _limit(blocks: list[OffloadedBlock]) -> int:
    """The pages mapped in at once: the largest block, plus what the current block hands back last,
    so the next block's last weight comes in before the forward reaches it (it never waits at a
    block boundary): the largest bit a block that hands back weights one by one hands back at once;
    when no block does, a whole block (two blocks at once, as a prefetch without a bound holds)."""
    largest = max((block.mapped_bytes() for block in blocks), default=0)
    piecewise = [max(sizes) for sizes in map(OffloadedBlock.hand_back_sizes, blocks) if len(sizes) > 1]
    return largest + (max(piecewise) if piecewise else largest)
