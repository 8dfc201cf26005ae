"""Python stacks as ``faulthandler`` writes them, read back: threads, frames, the user's line.

Each rank registers ``faulthandler`` for a signal (``x_runtime.process.progress``); the stall
watchdog sends it and reads the dump. A dump is one block per thread, innermost frame first::

    Current thread 0x00007f2d5a4e9740 (most recent call first):
      File "/work/train.py", line 42 in main
      File "/work/train.py", line 50 in <module>

What a summary needs from it: the main thread's frames, the torch.distributed call it waits in,
whether it waits for a DataLoader, and the innermost frame of the user's own code (not the
standard library, site-packages, torch or x), with that line's source text.
"""

from __future__ import annotations

import linecache
import os
import re
import sysconfig
from dataclasses import dataclass

__all__ = ["Frame", "Stack", "parse_dump", "waits_for_dataloader", "waits_in_collective", "where"]

_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+|\?\?\?) in (?P<func>.*)$')
# Packages whose frames are never "the user's line": the runtime, torch, and what they call.
_LIBRARIES = frozenset({"x_runtime", "x_common", "x_launch", "x_bigmodel", "torch", "accelerate"})
_C10D = "torch/distributed/distributed_c10d.py"  # c10d_logger's wrappers around it are not the call
_DATALOADER = "torch/utils/data/dataloader.py"


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def source(self) -> str:
        """The line's code, stripped ('' when the file cannot be read here)."""
        return linecache.getline(self.file, self.line).strip() if self.line > 0 else ""

    def shown(self) -> str:
        """``train.py:42 in main`` (paths under the working folder relative to it)."""
        path = self.file
        if os.path.isabs(path):
            relative = os.path.relpath(path)
            path = path if relative.startswith("..") else relative
        return f"{path}:{self.line} in {self.func}"


@dataclass(frozen=True)
class Stack:
    """One thread's frames, innermost first."""

    thread: int
    frames: tuple[Frame, ...]


def parse_dump(text: str) -> list[Stack]:
    """Every thread block of the last dump in ``text`` (earlier dumps in the same file are skipped).

    Examples:
        >>> dump = 'Current thread 0x00000000000000ff (most recent call first):\\n  File "t.py", line 3 in main\\n'
        >>> parse_dump(dump)[0].frames[0]
        Frame(file='t.py', line=3, func='main')
    """
    stacks: list[Stack] = []
    thread: int | None = None
    frames: list[Frame] = []
    for raw in text.splitlines():
        head = _THREAD.match(raw)
        if head is not None:
            if thread is not None:
                stacks.append(Stack(thread, tuple(frames)))
            thread, frames = int(head.group(1), 16), []
            continue
        frame = _FRAME.match(raw)
        if frame is not None and thread is not None:
            line = frame["line"]
            frames.append(Frame(frame["file"], int(line) if line.isdigit() else 0, frame["func"]))
    if thread is not None:
        stacks.append(Stack(thread, tuple(frames)))
    return stacks


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {os.path.realpath(paths[key]) for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    return tuple(sorted(roots))


_ROOTS = _library_roots()


def is_library(path: str) -> bool:
    """Whether ``path`` is the standard library, an installed package, torch or x (not the user's code)."""
    if path.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return True
    parts = path.replace("\\", "/").split("/")
    if "site-packages" in parts or "dist-packages" in parts or _LIBRARIES.intersection(parts):
        return True
    real = os.path.realpath(path) if os.path.isabs(path) else path
    return any(real.startswith(root + os.sep) for root in _ROOTS)


def where(stack: Stack) -> Frame | None:
    """The innermost frame of the user's own code, or the outermost frame when all are library code."""
    for frame in stack.frames:
        if not is_library(frame.file):
            return frame
    return stack.frames[-1] if stack.frames else None


def waits_in_collective(stack: Stack) -> str | None:
    """The torch.distributed function the thread is in (the outermost one: what was called), or None."""
    found = None
    for frame in stack.frames:
        if frame.file.replace("\\", "/").endswith(_C10D) and not frame.func.startswith("_"):
            found = frame.func
    return found


def waits_for_dataloader(stack: Stack) -> bool:
    """Whether the thread waits inside a DataLoader's iterator (for a batch from its workers)."""
    return any(frame.file.replace("\\", "/").endswith(_DATALOADER) for frame in stack.frames)
