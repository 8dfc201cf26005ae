"""A safetensors file read our way: tensors read straight into their destination, or viewed in place.

The format is an 8-byte little-endian header length, a JSON header ``{name: {"dtype", "shape",
"data_offsets": [begin, end]}}`` and the raw bytes. Reading it ourselves (rather than through
``safetensors.safe_open``) gives the two paths big-model loading needs:

* ``read_into``: ``preadv`` from the file into the tensor that will hold the weight, so loading
  costs one copy from the page cache, as reading the file does, with no mapped pages left in RSS;
* ``view``: a zero-copy tensor over a private memory map, for disk-offloaded weights used in place
  by a CPU forward; ``read_ahead`` starts reading a byte range into the page cache (nothing mapped
  in yet), ``populate`` faults it in ahead of use (the prefetch thread calls both) and ``release``
  hands the pages back to the kernel after use.

The header is checked as the ``safetensors`` library checks it (``x_bigmodel.files.safetensors_header``),
so a truncated or corrupt file is reported by name before anything is read, and a file safetensors
reads, we read.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from pathlib import Path

import torch

from x_bigmodel.devices.pages import MADV_POPULATE_READ, advise
from x_bigmodel.files.safetensors_header import TensorEntry, parse_header

__all__ = ["SafetensorsFile", "TensorEntry", "open_safetensors"]


class SafetensorsFile:
    """One safetensors file: its header parsed and checked; tensors read or viewed on demand.

    Thread-safe for reads: ``read_into`` uses ``preadv`` on one descriptor, and the memory map
    is created once under a lock.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            self.entries, self.metadata = parse_header(self._fd, self.path)
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

    def entry(self, key: str) -> TensorEntry:
        """Where ``key`` lies, once torch can hold it.

        Raises:
            ValueError: torch has no dtype for the tensor (F6 formats, a dtype this torch lacks),
                naming the file, the tensor and the dtype.
        """
        return self.entries[key].checked()

    def read(self, key: str) -> torch.Tensor:
        """A new tensor holding ``key``'s bytes (its own memory, not the file's)."""
        entry = self.entry(key)
        out = torch.empty(entry.shape, dtype=entry.dtype)
        self.read_into(key, out)
        return out

    def read_range(self, key: str, start: int, out: torch.Tensor) -> None:
        """Fill the contiguous CPU ``uint8`` tensor ``out`` with ``key``'s bytes from byte ``start`` on."""
        entry = self.entry(key)
        size = out.numel()
        if start < 0 or start + size > entry.nbytes:
            raise ValueError(f"bytes {start}..{start + size} lie outside {key!r} ({entry.nbytes} bytes)")
        if size == 0:
            return
        if self._fd < 0:
            data = self._mapping()
            out.copy_(torch.frombuffer(data, dtype=torch.uint8, count=size, offset=entry.offset + start))
            self.release([(entry.offset + start, size)])
            return
        self._pread(memoryview(out.numpy()).cast("B"), entry.offset + start)  # type: ignore[arg-type]

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
        entry = self.entry(key)
        if out.device.type != "cpu" or not out.is_contiguous() or out.dtype != entry.dtype:
            raise ValueError(f"read_into needs a contiguous CPU {entry.dtype} tensor, got {out.dtype} on {out.device}")
        if entry.nbytes == 0:
            return
        if self._fd < 0:
            out.copy_(self.view(key))
            self.release([(entry.offset, entry.nbytes)])
            return
        # numpy's stubs give ndarray __buffer__ only on Python >= 3.12; it is a buffer on every version.
        buffer = memoryview(out.view(-1).view(torch.uint8).numpy()).cast("B")  # type: ignore[arg-type]
        self._pread(buffer, entry.offset)

    def _pread(self, buffer: memoryview, offset: int) -> None:
        done = 0
        while done < len(buffer):
            n = os.preadv(self._fd, [buffer[done:]], offset + done)
            if n <= 0:
                raise ValueError(f"cannot read checkpoint file {str(self.path)!r}: it ended early (truncated?)")
            done += n

    def view(self, key: str) -> torch.Tensor:
        """A zero-copy tensor over the file's pages (a private map: writes never reach the file)."""
        entry = self.entry(key)
        if entry.nbytes == 0:
            return torch.empty(entry.shape, dtype=entry.dtype)
        assert entry.dtype is not None  # entry() refused a tensor torch has no dtype for
        data = self._mapping()
        flat = torch.frombuffer(data, dtype=torch.uint8, count=entry.nbytes, offset=entry.offset)
        return flat.view(entry.dtype).view(entry.shape)

    def populate(self, ranges: list[tuple[int, int]]) -> None:
        """Fault the pages of ``[(offset, nbytes)]`` into the map ahead of use (blocking; no GIL held)."""
        for offset, nbytes in ranges:
            _madvise(self._mapping(), offset, nbytes, MADV_POPULATE_READ, mmap.MADV_WILLNEED)

    def read_ahead(self, ranges: list[tuple[int, int]]) -> None:
        """Have the kernel read ``[(offset, nbytes)]`` into the page cache; nothing is mapped in."""
        for offset, nbytes in ranges:
            _madvise(self._mapping(), offset, nbytes, mmap.MADV_WILLNEED, None)

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
