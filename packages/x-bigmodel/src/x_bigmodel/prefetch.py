"""Fetching the next offloaded block's weights on a background thread while the current one runs.

Which block comes next is learned: the first forward assumes model order (and that the first
block follows the last, as in generation loops), and every forward records the order blocks
actually ran in, so models that run blocks out of registration order (a tied LM head using the
embedding, an encoder-decoder) are predicted right from their second step on. At most one block
is fetched ahead, so memory holds at most the running block plus the next one.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from x_bigmodel.offloaded_block import Fetched, OffloadedBlock

__all__ = ["Prefetcher"]


class Prefetcher:
    """Hands each block its weights, fetching the predicted next block's in the background."""

    def __init__(self, blocks: list[OffloadedBlock], enabled: bool = True) -> None:
        self._order = {id(block): index for index, block in enumerate(blocks)}
        self._blocks = blocks
        self._next: dict[int, OffloadedBlock] = {}
        self._previous: OffloadedBlock | None = None
        self._pending: tuple[OffloadedBlock, Future[Fetched]] | None = None
        self._enabled = enabled and len(blocks) > 1
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()

    def acquire(self, block: OffloadedBlock) -> Fetched:
        """``block``'s weights, from the prefetch when it was predicted, else fetched now."""
        with self._lock:
            if self._pid != os.getpid():
                # A forked child: the parent's worker thread does not exist here; start afresh.
                self._pid, self._executor, self._pending = os.getpid(), None, None
            if self._previous is not None and self._previous is not block:
                self._next[id(self._previous)] = block
            self._previous = block
            pending, self._pending = self._pending, None
        fetched = None
        if pending is not None:
            if pending[0] is block:
                fetched = pending[1].result()
            else:
                _drop(pending[1])
        if fetched is None:
            fetched = block.fetch()
        if self._enabled and not self._closed:
            following = self._predict(block)
            if following is not block:
                self._schedule(following)
        return fetched

    def close(self) -> None:
        """Stop prefetching for good (hooks still running fetch their weights inline)."""
        with self._lock:
            self._closed = True
            pending, self._pending = self._pending, None
            executor, self._executor = self._executor, None
        if pending is not None:
            _drop(pending[1])
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)

    def _predict(self, block: OffloadedBlock) -> OffloadedBlock:
        learned = self._next.get(id(block))
        if learned is not None:
            return learned
        return self._blocks[(self._order[id(block)] + 1) % len(self._blocks)]

    def _schedule(self, block: OffloadedBlock) -> None:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="x-bigmodel-prefetch")
            self._pending = (block, self._executor.submit(block.fetch, True))


def _drop(future: Future[Fetched]) -> None:
    if future.cancel():
        return
    # The block was not needed: its fetch error, if any, is not this forward's.
    with contextlib.suppress(Exception):
        future.result().discard()
