"""A safetensors file read our way: tensors read straight into their destination, or viewed in place.

The format is an 8-byte little-endian header length, a JSON header ``{name: {"dtype", "shape",
"data_offsets": [begin, end]}}`` and the raw bytes. Reading it ourselves (rather than through
``safetensors.safe_open``) gives the two paths big-model loading needs:

* ``read_into``: ``preadv`` from the file into the tensor that will hold the weight, so loading
  costs one copy from the page cache, as reading the file does, with no mapped pages left in RSS;
* ``view``: a zero-copy tensor over a private memory map, for disk-offloaded weights used in place
  by a CPU forward; ``populate`` faults a byte range in ahead of use (the prefetch thread calls it)
  and ``release`` hands the pages back to the kernel after use.

The header is checked against the file's size, so a truncated or corrupt file is reported by name
before anything is read.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import struct
import threading
from pathlib import Path
from typing import Any

import torch

from x_bigmodel._pages import MADV_POPULATE_READ, advise

__all__ = ["SafetensorsFile", "TensorEntry", "open_safetensors"]

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
# A header larger than this is not a safetensors file (the format itself caps it at 100 MB).
_MAX_HEADER = 100 * 2**20


class TensorEntry:
    """Where one tensor lies in its file: absolute byte offset, size, dtype and shape."""

    __slots__ = ("dtype", "nbytes", "offset", "shape")

    def __init__(self, offset: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
        self.offset, self.nbytes, self.dtype, self.shape = offset, nbytes, dtype, shape


class SafetensorsFile:
    """One safetensors file: its header parsed and checked; tensors read or viewed on demand.

    Thread-safe for reads: ``read_into`` uses ``preadv`` on one descriptor, and the memory map
    is created once under a lock.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            self.entries, self.metadata = _parse_header(self._fd, self.path)
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            raise
        self._map: mmap.mmap | None = None
        self._lock = threading.Lock()

    @classmethod
    def raw(cls, path: str | os.PathLike[str], key: str, dtype: torch.dtype, shape: tuple[int, ...]) -> SafetensorsFile:
        """A headerless file holding one tensor's bytes (Accelerate's ``<name>.dat`` offload files)."""
        self = cls.__new__(cls)
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self.metadata = {}
        self._map, self._lock = None, threading.Lock()
        nbytes = _numel(shape) * dtype.itemsize
        size = os.fstat(self._fd).st_size
        if size < nbytes:
            os.close(self._fd)
            self._fd = -1
            raise ValueError(
                f"offloaded weight file {str(self.path)!r} holds {size} bytes but {key} ({list(shape)} of {dtype}) "
                f"needs {nbytes}; the offload folder is incomplete: offload the model again"
            )
        self.entries = {key: TensorEntry(0, nbytes, dtype, shape)}
        return self

    def close(self) -> None:
        # The map stays valid for views still alive: mmap closes when its last exporter goes.
        self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)

    def keys(self) -> list[str]:
        return sorted(self.entries)

    def read(self, key: str) -> torch.Tensor:
        """A new tensor holding ``key``'s bytes (its own memory, not the file's)."""
        entry = self.entries[key]
        out = torch.empty(entry.shape, dtype=entry.dtype)
        self.read_into(key, out)
        return out

    def map_only(self) -> SafetensorsFile:
        """Map the file and close its descriptor: reads then copy from the map. A model offloaded
        to thousands of files (one per tensor, as Accelerate lays them out) then holds one
        descriptor per file (the map's own) instead of two."""
        if self._fd >= 0 and os.fstat(self._fd).st_size > 0:  # an empty file cannot be mapped (or read)
            self._mapping()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        return self

    def read_into(self, key: str, out: torch.Tensor) -> None:
        """Fill the contiguous CPU tensor ``out`` (``key``'s shape and dtype) from the file."""
        entry = self.entries[key]
        if out.device.type != "cpu" or not out.is_contiguous() or out.dtype != entry.dtype:
            raise ValueError(f"read_into needs a contiguous CPU {entry.dtype} tensor, got {out.dtype} on {out.device}")
        if entry.nbytes == 0:
            return
        if self._fd < 0:
            out.copy_(self.view(key))
            self.release([(entry.offset, entry.nbytes)])
            return
        buffer = memoryview(out.view(-1).view(torch.uint8).numpy()).cast("B")
        done = 0
        while done < entry.nbytes:
            n = os.preadv(self._fd, [buffer[done:]], entry.offset + done)
            if n <= 0:
                raise ValueError(f"cannot read checkpoint file {str(self.path)!r}: it ended early (truncated?)")
            done += n

    def view(self, key: str) -> torch.Tensor:
        """A zero-copy tensor over the file's pages (a private map: writes never reach the file)."""
        entry = self.entries[key]
        if entry.nbytes == 0:
            return torch.empty(entry.shape, dtype=entry.dtype)
        data = self._mapping()
        flat = torch.frombuffer(data, dtype=torch.uint8, count=entry.nbytes, offset=entry.offset)
        return flat.view(entry.dtype).view(entry.shape)

    def populate(self, ranges: list[tuple[int, int]]) -> None:
        """Fault the pages of ``[(offset, nbytes)]`` into the map ahead of use (blocking; no GIL held)."""
        for offset, nbytes in ranges:
            _madvise(self._mapping(), offset, nbytes, MADV_POPULATE_READ, mmap.MADV_WILLNEED)

    def release(self, ranges: list[tuple[int, int]]) -> None:
        """Drop the mapped pages of ``[(offset, nbytes)]`` from this process (they stay in the page cache)."""
        if self._map is None:
            return
        for offset, nbytes in ranges:
            # Whole pages inside the range only: a page shared with a neighbour in use stays mapped.
            start = -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE
            end = (offset + nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
            _madvise(self._map, start, end - start, mmap.MADV_DONTNEED, None)

    def _mapping(self) -> mmap.mmap:
        with self._lock:
            if self._map is None:
                if self._fd < 0:
                    raise ValueError(f"{str(self.path)!r} was closed")
                self._map = mmap.mmap(self._fd, 0, access=mmap.ACCESS_COPY)
            return self._map


def open_safetensors(path: str | os.PathLike[str]) -> SafetensorsFile:
    return SafetensorsFile(path)


def _parse_header(fd: int, path: Path) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    size = os.fstat(fd).st_size
    problem = None
    header: Any = None
    start = 0
    if size < 8:
        problem = f"it is {size} bytes long, shorter than a safetensors header"
    else:
        (length,) = struct.unpack("<Q", os.pread(fd, 8, 0))
        start = 8 + length
        if length > _MAX_HEADER or start > size:
            problem = f"its header claims {length} bytes but the file has {size}"
        else:
            try:
                header = json.loads(os.pread(fd, length, 8))
                if not isinstance(header, dict):
                    raise ValueError("the header is not a JSON object")
            except (UnicodeDecodeError, ValueError) as exc:
                problem = f"its header is not valid JSON ({exc})"
    entries: dict[str, TensorEntry] = {}
    metadata: dict[str, str] = {}
    end_of_data = 0
    if problem is None:
        for name, info in header.items():
            if name == "__metadata__":
                metadata = info if isinstance(info, dict) else {}
                continue
            try:
                begin, end = (int(v) for v in info["data_offsets"])
                dtype = DTYPES[info["dtype"]]
                shape = tuple(int(d) for d in info["shape"])
            except (KeyError, TypeError, ValueError):
                problem = f"its header entry for {name!r} is malformed ({info!r})"
                break
            expected = _numel(shape) * dtype.itemsize
            if end - begin != expected or begin < 0:
                problem = f"{name!r} spans {end - begin} bytes but shape {list(shape)} of {dtype} needs {expected}"
                break
            entries[name] = TensorEntry(start + begin, expected, dtype, shape)
            end_of_data = max(end_of_data, end)
        if problem is None and start + end_of_data > size:
            problem = f"it is {size} bytes long but its header describes {start + end_of_data}"
    if problem is not None:
        raise ValueError(
            f"cannot read checkpoint file {str(path)!r}: {problem}; the file is corrupt or truncated "
            "(an interrupted download or save?); download or save it again"
        )
    return entries, metadata


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _madvise(data: mmap.mmap, offset: int, nbytes: int, advice: int, fallback: int | None) -> None:
    anchor = ctypes.c_char.from_buffer(data)
    try:
        advise(ctypes.addressof(anchor) + offset, nbytes, advice, fallback)
    finally:
        del anchor  # an exported buffer would keep the map from closing
