"""``madvise`` on a byte range of this process's memory, page-aligned; a no-op off Linux."""

from __future__ import annotations

import ctypes
import mmap
import sys
from typing import Any

MADV_POPULATE_READ = 22  # Linux >= 5.14: fault pages in now, synchronously


def advise(start: int, nbytes: int, advice: int, fallback: int | None = None) -> None:
    """Apply ``advice`` to the pages covering ``[start, start + nbytes)``; on failure try ``fallback``.

    ctypes releases the GIL for the call, so a thread blocked here (reading pages in) does not
    hold up Python code running beside it.
    """
    if nbytes <= 0 or not sys.platform.startswith("linux"):
        return
    libc = _libc()
    if libc is None:
        return
    aligned = start - start % mmap.PAGESIZE
    length = ctypes.c_size_t(start + nbytes - aligned)
    if libc.madvise(ctypes.c_void_p(aligned), length, advice) != 0 and fallback is not None:
        libc.madvise(ctypes.c_void_p(aligned), length, fallback)


def _libc() -> Any:
    if not _LIBC:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            _LIBC.append(libc)
        except (OSError, AttributeError):
            _LIBC.append(None)
    return _LIBC[0]


# One lookup per process, cached: not state anyone needs to reset.
_LIBC: list[Any] = []
