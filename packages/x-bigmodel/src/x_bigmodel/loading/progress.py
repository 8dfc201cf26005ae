"""The loading progress bar: bytes read of the bytes to read, with rate and time left.

A load long enough to be waited on (``PROGRESS_MIN_BYTES`` or more to read) shows a tqdm bar on
stderr, advanced as tensors are read (a 5 GB shard moves it by many steps, not one):

    Loading weights:  42%|████▏     | 2.10G/5.00G [00:01<00:02, 1.38GB/s]   (decimal units: G is 10**9 bytes)

It is shown only on the main process (rank 0), only when stderr is a terminal (logs and pipes get
no carriage-return noise), and never with ``show_progress=False`` or ``TQDM_DISABLE=1`` (tqdm's
own switch, read when tqdm is imported).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["PROGRESS_MIN_BYTES", "ByteProgress", "byte_progress"]

# Below this a load takes well under two seconds even from a cold disk (~1 GB/s) and at page
# cache speed far less: a bar would flash by. 1 GiB and up is where waiting is felt.
PROGRESS_MIN_BYTES = 2**30


class ByteProgress:
    """Call with the bytes just read; a no-op when no bar is shown. Close (or use ``with``) at the end."""

    def __init__(self, bar: Any = None) -> None:
        self._bar = bar

    @property
    def shown(self) -> bool:
        return self._bar is not None

    def __call__(self, nbytes: int) -> None:
        if self._bar is not None and nbytes:
            self._bar.update(nbytes)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> ByteProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def byte_progress(total: int, show_progress: bool = True, desc: str = "Loading weights") -> ByteProgress:
    """A bar over ``total`` bytes when it is worth showing (see the module docs), else a silent one.

    Examples:
        >>> with byte_progress(4096) as advance:  # too small to show
        ...     advance(4096)
        ...     advance.shown
        False
    """
    if not show_progress or total < PROGRESS_MIN_BYTES or not _stderr_is_terminal():
        return ByteProgress()
    from x_common.process_env import process_env

    if process_env().rank != 0:
        return ByteProgress()
    from tqdm.auto import tqdm

    return ByteProgress(tqdm(total=total, desc=desc, unit="B", unit_scale=True, file=sys.stderr, dynamic_ncols=True))


def _stderr_is_terminal() -> bool:
    stream = sys.stderr
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False
