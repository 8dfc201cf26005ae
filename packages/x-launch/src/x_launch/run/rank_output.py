"""Each rank's stderr, which torchrun writes to a file per rank, followed to the terminal by x-launch.

x-launch keeps every rank's stderr in a file so that a failure summary can quote the failing
rank's last lines. torchrun's own ``--tee`` would copy those files to the terminal, but with one
thread per rank that polls every 0.1 s, and its agent joins those threads when the workers have
exited: up to 0.1 s added to every launch, after the job's work is done. Here the files are
followed from x-launch's process, beside the agent rather than in it; once torchrun has exited,
what is left is read at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["RankOutput"]

# How often the files are read while the job runs: output reaches the terminal this late at most.
POLL_S = 0.05


class RankOutput:
    """Pass each ``<folder>/<run>/attempt_<n>/<local rank>/stderr.log`` to ``write``, lines prefixed as torchrun does.

    The prefix is torchrun's ``[<role><local rank>]:``, so the terminal looks the same as with
    ``--tee``. Lines are written whole; a last line without a newline is ended by :meth:`stop`.
    """

    def __init__(self, folder: Path, write: Callable[[bytes], None], role: str = "default") -> None:
        self._folder = folder
        self._write = write
        self._role = role
        self._files: dict[Path, tuple[BinaryIO, bytes]] = {}  # open file, its unfinished line
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="x-launch rank output", daemon=True)

    def start(self) -> RankOutput:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop following, then copy whatever the files still hold (the ranks have exited); once."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self._read(final=True)
        for handle, _ in self._files.values():
            handle.close()

    def _follow(self) -> None:
        while not self._stop.wait(POLL_S):
            self._read(final=False)

    def _read(self, *, final: bool) -> None:
        for path in sorted(self._folder.glob("*/attempt_*/*/stderr.log")):
            if path not in self._files:
                try:
                    self._files[path] = (open(path, "rb"), b"")  # noqa: SIM115 - closed in stop()
                except OSError:
                    continue  # torchrun removed an old attempt's folder
            handle, pending = self._files[path]
            data = pending + handle.read()
            lines = data.split(b"\n")
            rest = lines.pop()  # b"" after a final newline
            if final and rest:
                lines.append(rest)
                rest = b""
            self._files[path] = (handle, rest)
            if lines:
                prefix = f"[{self._role}{path.parent.name}]:".encode()
                self._write(b"".join(prefix + line + b"\n" for line in lines))
