"""Reading the mapped CPU weights into the page cache in the background, once the load returns.

``from_pretrained`` leaves CPU weights as the files' mapped pages, read by their first use, as
transformers does. From a cold page cache the first forward then reads them one page fault at a
time, each fault waiting for its read: twice as slow as reading the files front to back. Here a
daemon thread asks the kernel to read them ahead (``posix_fadvise(WILLNEED)``) in the order the
model holds them, which is the order a forward uses them, a chunk at a time, while the caller goes
on: the forward then finds the pages cached or already on their way.

The reads fill the page cache only: nothing is mapped into the process, so RSS does not grow, and
the pages of embedding rows never looked up are not made resident (they are read into the cache,
not into the model). Only the tensors placed on the CPU are read: disk-offloaded weights are left
to the prefetch thread, which reads each block just before its forward, since reading them all
ahead would fill the page cache with what the device map planned not to keep in RAM. The thread
stops when the model is freed or the interpreter exits, and a failed advice (a file replaced, a
system without ``posix_fadvise``) only ends it early: nothing depends on it.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ByteRange", "Readahead", "merge_ranges", "start_readahead"]

# Advice is given this many bytes at a time: large enough for the kernel to issue big sequential
# reads, small enough that the thread stops soon after it is asked to.
CHUNK = 32 * 2**20


@dataclass(frozen=True)
class ByteRange:
    """``nbytes`` bytes of the file at ``path``, from ``offset``."""

    path: Path
    offset: int
    nbytes: int


class Readahead:
    """The running (or finished) read-ahead of ``ranges``, in their order."""

    def __init__(self, ranges: list[ByteRange], chunk: int = CHUNK) -> None:
        self.ranges = ranges
        self._chunk = chunk
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="x-bigmodel-readahead", daemon=True)

    def start(self, owner: object | None = None) -> Readahead:
        """Start reading; the reads stop once ``owner`` (the model) is garbage collected."""
        if owner is not None:
            # The finalizer holds the event, not this object: a finished read-ahead is freed.
            weakref.finalize(owner, self._stop.set)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the thread to stop after the chunk it is advising (returns at once)."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the advice to be given (not for the reads to finish); ``True`` when it was."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        fds: dict[Path, int] = {}
        try:
            for item in self.ranges:
                fd = fds.get(item.path)
                if fd is None:
                    fd = fds[item.path] = os.open(item.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                end = item.offset + item.nbytes
                for start in range(item.offset, end, self._chunk):
                    if self._stop.is_set():
                        return
                    os.posix_fadvise(fd, start, min(self._chunk, end - start), os.POSIX_FADV_WILLNEED)
        except (OSError, AttributeError):
            return  # only a hint: the first use still reads whatever was not read ahead
        finally:
            for fd in fds.values():
                os.close(fd)


def merge_ranges(ranges: Iterable[ByteRange], gap: int = 4096) -> list[ByteRange]:
    """``ranges`` in their order, each joined with the one before it when it starts where that one
    ends in the same file (up to ``gap`` bytes later: safetensors pads tensors for alignment)."""
    merged: list[ByteRange] = []
    for item in ranges:
        if item.nbytes <= 0:
            continue
        last = merged[-1] if merged else None
        if last is not None and last.path == item.path and 0 <= item.offset - (last.offset + last.nbytes) <= gap:
            merged[-1] = ByteRange(last.path, last.offset, item.offset + item.nbytes - last.offset)
        else:
            merged.append(item)
    return merged


def start_readahead(ranges: Iterable[ByteRange], owner: object | None = None, chunk: int = CHUNK) -> Readahead | None:
    """Read ``ranges`` into the page cache on a daemon thread, in the order given (adjacent ranges
    of a file joined); stop when ``owner`` is freed. ``None`` when there is nothing to read or the
    system has no ``posix_fadvise``."""
    merged = merge_ranges(ranges)
    if not merged or not hasattr(os, "posix_fadvise"):
        return None
    return Readahead(merged, chunk).start(owner)
