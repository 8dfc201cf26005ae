"""Writing files and folders so that a crash never leaves a half-written one in place.

Everything is written under a temporary name beside its target, flushed to disk (``fsync``),
then renamed over the target: a reader sees the old version or the new one, never a mix.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from x_runtime.io.disk_space import allocated_bytes, disk_full_writing, out_of_space_errno

__all__ = ["fsync_dir", "fsync_tree", "partial_dir_for", "replace_dir", "write_file_atomic"]


def fsync_dir(path: Path) -> None:
    """Persist a folder's entries (the renames in it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flush every file below ``root`` and the folders that hold them."""
    for folder, _dirs, files in os.walk(root):
        for name in files:
            with open(os.path.join(folder, name), "rb+") as handle:
                os.fsync(handle.fileno())
        fsync_dir(Path(folder))


def write_file_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp)`` then move ``tmp`` over ``path``; ``path`` is untouched on failure.

    A full disk raises ``DiskFullError`` naming ``path``, the bytes needed and free.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except Exception as error:
        code = out_of_space_errno(error, path.parent)  # measured while ``tmp`` still fills the disk
        if code is None:
            raise
        written = allocated_bytes(tmp) if tmp.is_file() else 0
        tmp.unlink(missing_ok=True)
        raise disk_full_writing(path, code, written) from None  # torch's text names no file
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)


def partial_dir_for(target: Path) -> Path:
    """Where the folder for ``target`` is assembled (same filesystem, hidden, one per target)."""
    return target.with_name(f".{target.name}.partial")


def replace_dir(partial: Path, target: Path) -> None:
    """Move a complete ``partial`` folder to ``target``, replacing an existing one.

    A new target appears in one rename. An existing one is first renamed aside and removed
    after the new one is in place, so there is always one complete folder on disk.
    """
    fsync_tree(partial)
    if target.exists():
        old = target.with_name(f".{target.name}.old")
        if old.exists():
            shutil.rmtree(old)
        os.replace(target, old)
        os.replace(partial, target)
        fsync_dir(target.parent)
        shutil.rmtree(old)
    else:
        os.replace(partial, target)
        fsync_dir(target.parent)
