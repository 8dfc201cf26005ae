"""Disk space for checkpoints: what a save needs, what is free, and a full disk said in one line.

``save_checkpoint`` compares the two before it writes and refuses a save that cannot fit. When a
disk fills anyway (other writers, files larger than their tensors, objects whose size is only known
once written), every layer's form of the error (Python's ``OSError``, torch's zip writer's
``unexpected pos``, safetensors' ``os error 28``) becomes a ``DiskFullError`` that names the
folder, the bytes needed and the bytes free.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from x_common.sizes import format_size

__all__ = [
    "DiskFullError",
    "Room",
    "allocated_bytes",
    "disk_full_while_saving",
    "disk_full_writing",
    "free_bytes",
    "measure_room",
    "out_of_space_errno",
    "refuse_if_short",
    "tensor_bytes",
]

_OUT_OF_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
_RUST_ERRNO = re.compile(r"\(os error (\d+)\)")  # how safetensors (Rust's io::Error) reports errno
# torch's own file writer loses errno: a short write surfaces as one of these enforce failures.
_SHORT_WRITE = ("unexpected pos", "file write failed", "iostream error")
_NEARLY_FULL = 1 << 20  # a short write with less than this free is taken to be the full disk


class DiskFullError(OSError):
    """A checkpoint or file did not fit on its disk; ``errno`` is ``ENOSPC`` (or ``EDQUOT``).

    Attributes:
        path: the checkpoint folder (or the file) that was being written.
        needed: bytes it needs at least, when known.
        free: bytes free on that filesystem once the partial write is removed, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        path: Path | None = None,
        needed: int | None = None,
        free: int | None = None,
        code: int = errno.ENOSPC,
    ) -> None:
        super().__init__(code, message)
        self.message, self.path, self.needed, self.free = message, path, needed, free

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:  # OSError's would call __init__(errno, message)
        return (_rebuild, (self.message, self.path, self.needed, self.free, self.errno))


def _rebuild(message: str, path: Path | None, needed: int | None, free: int | None, code: int) -> DiskFullError:
    return DiskFullError(message, path=path, needed=needed, free=free, code=code)


def _existing(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def free_bytes(path: str | Path) -> int | None:
    """Bytes this process may still write on the filesystem holding ``path``; None if unknown."""
    where = _existing(Path(path))
    try:
        stats = os.statvfs(where)
    except (AttributeError, OSError):  # no statvfs (Windows)
        try:
            return shutil.disk_usage(where).free
        except OSError:
            return None
    # root may also fill the blocks a filesystem reserves for it (ext4 keeps 5%).
    blocks = stats.f_bfree if hasattr(os, "geteuid") and os.geteuid() == 0 else stats.f_bavail
    return blocks * stats.f_frsize


def _block(path: Path) -> int:
    try:
        return os.statvfs(_existing(path)).f_frsize or 4096
    except (AttributeError, OSError):
        return 4096


def _mount(path: Path) -> Path:
    path = _existing(path)
    try:
        device = path.stat().st_dev
        while path.parent != path and path.parent.stat().st_dev == device:
            path = path.parent
    except OSError:
        pass
    return path


def allocated_bytes(path: str | Path) -> int:
    """Disk space a file or folder takes now (allocated blocks, not apparent size)."""
    path = Path(path)
    paths = [path] if path.is_file() else [Path(d) / f for d, _dirs, files in os.walk(path) for f in files]
    total = 0
    for item in paths:
        try:
            stat = item.stat()
        except OSError:
            continue
        total += getattr(stat, "st_blocks", 0) * 512 or stat.st_size
    return total


def _chain(error: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def out_of_space_errno(error: BaseException, folder: str | Path | None = None) -> int | None:
    """``ENOSPC``/``EDQUOT`` if ``error`` (or what caused it) is a full disk or quota, else None.

    ``folder``: where the write went, to tell torch's errno-less short write on a full disk apart
    from other failures.
    """
    for current in _chain(error):
        if isinstance(current, OSError) and current.errno in _OUT_OF_SPACE:
            return current.errno
        text = str(current)
        rust = _RUST_ERRNO.search(text)
        if rust and int(rust.group(1)) in _OUT_OF_SPACE:
            return int(rust.group(1))
        if "No space left on device" in text:
            return errno.ENOSPC
        if folder is not None and any(s in text for s in _SHORT_WRITE):
            free = free_bytes(folder)
            if free is not None and free < _NEARLY_FULL:
                return errno.ENOSPC
    return None


def _amounts(needed: int, free: int, where: Path) -> str:
    return (
        f"it needs at least {format_size(needed)} ({needed} bytes), "
        f"{format_size(free)} ({free} bytes) free on {_mount(where)}"
    )


def _reason(code: int) -> str:
    return "disk quota exceeded" if code != errno.ENOSPC else "no space left on device"


def disk_full_writing(path: Path, code: int, written: int) -> DiskFullError:
    """The error for one file that did not fit (its partial copy already removed)."""
    free = free_bytes(path.parent) or 0
    needed = written + _block(path.parent)  # it had written ``written`` and wanted more
    return DiskFullError(
        f"{_reason(code)} writing {path}: {_amounts(needed, free, path.parent)}",
        path=path,
        needed=needed,
        free=free,
        code=code,
    )


def disk_full_while_saving(error: BaseException, *, target: Path, partial: Path, needed: int) -> DiskFullError:
    """The error for a checkpoint whose disk filled mid-save; ``partial`` is about to be removed.

    ``needed`` is the estimate made before writing; what had been written when the disk filled
    (plus one block), and what is free once the partial save is gone (plus one block), are also lower
    bounds, and the largest is reported.
    """
    code = out_of_space_errno(error) or errno.ENOSPC
    in_partial = allocated_bytes(partial) if partial.is_dir() else 0
    failed_file = next((e for e in _chain(error) if isinstance(e, DiskFullError) and e.needed), None)
    # ``failed_file.needed`` is tested again only so the checker sees an int (the search already required it).
    consumed = in_partial + (failed_file.needed if failed_file and failed_file.needed else _block(partial))
    free = (free_bytes(partial) or 0) + in_partial  # what is free once ``partial`` is gone
    # The disk filled during this save, so all that is free once its files are gone was not enough. This
    # bound also counts what other ranks saving into the same folder had written into files they removed
    # when the disk filled under them too, which ``consumed`` (this rank's view) misses.
    needed = max(needed, consumed, free + _block(partial))
    at = f" (at {failed_file.path.name})" if failed_file and failed_file.path else ""
    return DiskFullError(
        f"{_reason(code)} while saving the checkpoint to {target}{at}: {_amounts(needed, free, target)}; "
        f"the partial save is removed{_previous(target)}",
        path=target,
        needed=needed,
        free=free,
        code=code,
    )


def _previous(target: Path) -> str:
    # A folder with files in it is a checkpoint: save_state refuses to replace anything else.
    try:
        kept = target.is_dir() and any(target.iterdir())
    except OSError:
        kept = False
    return ", the previous checkpoint there is unchanged" if kept else ""


def tensor_bytes(models: Iterable[torch.nn.Module], optimizers: Iterable[Any]) -> int:
    """Bytes of the weights and optimizer state held on this rank: a lower bound of their files.

    Reads sizes only (no ``state_dict()``: on sharded strategies that is a collective, and a copy).
    Tensors sharing memory (tied weights) count once; a sharded tensor counts this rank's shard.
    """
    tensors: list[Any] = [t for model in models for t in (*model.parameters(), *model.buffers())]
    for optimizer in optimizers:
        state = getattr(optimizer, "state", None)
        for values in state.values() if isinstance(state, Mapping) else ():
            if isinstance(values, Mapping):
                tensors.extend(v for v in values.values() if isinstance(v, torch.Tensor))
    seen: set[Any] = set()
    total = 0
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # DTensor
        if local.device.type == "meta":
            continue
        try:
            key: Any = (local.device, local.untyped_storage().data_ptr(), local.storage_offset(), local.numel())
        except (RuntimeError, NotImplementedError):  # tensors without host-visible storage (XLA)
            key = id(local)
        if key not in seen:
            seen.add(key)
            total += local.numel() * local.element_size()
    return total


@dataclass(frozen=True)
class Room:
    """What one rank is about to write into one folder, and what its filesystem has free."""

    rank: int
    target: str
    filesystem: tuple[str, int] | None  # (host, device id); None: unknown, never refused
    needed: int
    free: int | None
    staged: int = 0  # already in the staging folder (its token), gone before the checkpoint lands


def measure_room(rank: int, target: Path, partial: Path, needed: int) -> Room:
    where = partial if partial.exists() else _existing(target)
    try:
        filesystem: tuple[str, int] | None = (socket.gethostname(), where.stat().st_dev)
    except OSError:
        filesystem = None
    staged = allocated_bytes(partial) if partial.is_dir() else 0
    return Room(
        rank=rank, target=str(target), filesystem=filesystem, needed=needed, free=free_bytes(where), staged=staged
    )


def _free_for(group: Sequence[Room]) -> int:
    staged = {r.target: r.staged for r in group}  # ranks sharing a folder share its staging folder
    return min(r.free or 0 for r in group) + sum(staged.values())


def refuse_if_short(rooms: Sequence[Room], rank: int) -> None:
    """Raise on every rank when the ranks writing to one filesystem need more than it has free.

    ``rooms`` is every rank's, in rank order (the same list on every rank), so every rank decides
    alike without another collective; a rank names its own filesystem first.
    """
    groups: dict[tuple[str, int], list[Room]] = {}
    for room in rooms:
        if room.filesystem is not None and room.free is not None:
            groups.setdefault(room.filesystem, []).append(room)
    short = [group for group in groups.values() if sum(r.needed for r in group) > _free_for(group)]
    if not short:
        return
    group = next((g for g in short if any(r.rank == rank for r in g)), short[0])
    needed, free = sum(r.needed for r in group), _free_for(group)
    targets = list(dict.fromkeys(r.target for r in group))
    ranks = "" if len(rooms) == 1 else f" (rank{'s' if len(group) > 1 else ''} {', '.join(str(r.rank) for r in group)})"
    where = Path(targets[0])
    raise DiskFullError(
        f"not enough disk space to save the checkpoint to {', '.join(targets)}{ranks}: "
        f"{_amounts(needed, free, where)}; nothing was written{_previous(where)}",
        path=where,
        needed=needed,
        free=free,
    )
