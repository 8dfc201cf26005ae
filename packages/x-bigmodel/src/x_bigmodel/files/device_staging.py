"""Reading checkpoint tensors straight onto a GPU through two reused pinned buffers.

Reading a tensor into fresh CPU memory and then calling ``.to("cuda")`` costs three passes over
its bytes: the kernel's copy into the new pages (each one faulted and zeroed first), then torch's
own staging of a pageable copy through a pinned buffer, then the transfer. Measured on an H200 with
a warm page cache, a 2.99 GB Llama loaded that way took 1.73 s against 0.69 s for safetensors'
own ``load_file(device="cuda:0")`` and 0.46 s for the bytes' floor (read into one pinned buffer,
copy to the GPU). Here the file is read into a pinned chunk and the chunk copied asynchronously
to the tensor's place on the GPU while the next chunk is read into the other buffer: the floor's
work, once per byte.
"""

from __future__ import annotations

import torch

from x_bigmodel.files.safetensors_file import SafetensorsFile

# Large enough that a read and a copy each take ~1-3 ms (per-call costs vanish), small enough that
# the two pinned buffers are a rounding error beside any model worth staging.
CHUNK_BYTES = 16 * 2**20


class DeviceStaging:
    """Two pinned chunks per device, used by every tensor one load reads onto that device.

    The buffers come from torch's pinned host allocator (kept in its cache after the load, 32 MiB).
    A chunk is refilled only after the copy that last read it has finished (an event per chunk),
    so the CPU reads chunk ``n+1`` while the GPU copies chunk ``n``.

    Examples:
        >>> import tempfile, os
        >>> from safetensors.torch import save_file
        >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
        >>> save_file({"w": torch.arange(10.0)}, path)
        >>> with SafetensorsFile(path) as file:
        ...     DeviceStaging(chunk_bytes=8).read(file, "w", torch.device("cpu")).tolist()[-3:]
        [7.0, 8.0, 9.0]
    """

    def __init__(self, chunk_bytes: int | None = None) -> None:
        self.chunk_bytes = chunk_bytes or CHUNK_BYTES
        self._slots: dict[torch.device, list[tuple[torch.Tensor, object | None]]] = {}
        self._turn = 0

    def read(self, file: SafetensorsFile, key: str, device: torch.device) -> torch.Tensor:
        """``key`` of ``file`` as a new tensor on ``device``, in the file's dtype.

        The copies are queued on ``device``'s current stream, so work queued after this call on that
        stream sees the whole tensor; the CPU returns as soon as the last chunk is queued.
        """
        entry = file.entry(key)
        assert entry.dtype is not None  # entry() refused a tensor torch has no dtype for
        out = torch.empty(entry.shape, dtype=entry.dtype, device=device)
        flat = out.view(-1).view(torch.uint8) if entry.nbytes else out
        done = 0
        while done < entry.nbytes:
            size = min(self.chunk_bytes, entry.nbytes - done)
            chunk = self._free_chunk(device)
            file.read_range(key, done, chunk[:size])
            flat[done : done + size].copy_(chunk[:size], non_blocking=device.type == "cuda")
            self._copied(device)
            done += size
        return out

    def close(self) -> None:
        """Wait for the copies still reading the chunks, then let the chunks go."""
        for slots in self._slots.values():
            for _, event in slots:
                if event is not None:
                    event.synchronize()  # type: ignore[attr-defined]
        self._slots.clear()

    def __enter__(self) -> DeviceStaging:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _free_chunk(self, device: torch.device) -> torch.Tensor:
        slots = self._slots.get(device)
        if slots is None:
            pin = device.type == "cuda"
            slots = self._slots[device] = [
                (torch.empty(self.chunk_bytes, dtype=torch.uint8, pin_memory=pin), None) for _ in range(2)
            ]
        self._turn = (self._turn + 1) % 2
        chunk, event = slots[self._turn]
        if event is not None:
            event.synchronize()  # type: ignore[attr-defined]  # the copy that read this chunk is done
        return chunk

    def _copied(self, device: torch.device) -> None:
        if device.type != "cuda":
            return  # the copy was synchronous
        chunk, _ = self._slots[device][self._turn]
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        self._slots[device][self._turn] = (chunk, event)
