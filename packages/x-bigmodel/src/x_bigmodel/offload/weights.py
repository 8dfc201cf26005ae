"""Where offloaded weights live between forwards, and bringing one onto its execution device.

A *weight source* gives one tensor in its final dtype on request:

* ``MemoryWeight``: a tensor kept in RAM (CPU offload towards an accelerator);
* ``FileWeight``: a tensor in a safetensors file (the checkpoint itself, read in place) or in a raw
  ``<name>.dat`` file (Accelerate's offload folder layout). For a CPU forward in the stored dtype
  it is a zero-copy view over the file's pages, read ahead into the page cache (``read_ahead``),
  faulted in ahead of use (``populate``, from the prefetch thread) and handed back after it
  (``release``); otherwise it is read and converted.

An *offload index* maps parameter names to their place on disk: ``{"safetensors_file", "key",
"dtype", "shape"}`` (ours; Accelerate's ``"weight_name"`` is read as ``"key"``) or just
``{"dtype", "shape"}`` for a raw ``<name>.dat`` file in the offload folder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from x_bigmodel.devices.tensor_placement import torch_dtype
from x_bigmodel.files.safetensors_file import SafetensorsFile

__all__ = [
    "FileWeight",
    "MemoryWeight",
    "read_offload_index",
    "source_value",
    "sources_from_index",
    "write_offload_files",
    "write_offload_index",
]

INDEX_NAME = "index.json"


class MemoryWeight:
    """A weight held in memory (already in its final dtype), copied to the device for each use."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def fetch(self, device: torch.device) -> torch.Tensor:
        return self.tensor.to(device, non_blocking=device.type != "cpu")

    def mapped_bytes(self, device: torch.device) -> int:
        return 0

    def read_ahead(self, device: torch.device) -> None:
        pass

    def populate(self, device: torch.device) -> None:
        pass

    def release(self, device: torch.device) -> None:
        pass


class FileWeight:
    """A weight in a file, read by memory map (in place) or by ``preadv`` (when it must be converted)."""

    def __init__(self, file: SafetensorsFile, key: str, dtype: torch.dtype) -> None:
        self.file, self.key, self.dtype = file, key, dtype
        self.entry = file.entry(key)

    def in_place(self, device: torch.device) -> bool:
        return device.type == "cpu" and self.dtype == self.entry.dtype

    def fetch(self, device: torch.device) -> torch.Tensor:
        if self.in_place(device):
            return self.file.view(self.key)
        return self.file.read(self.key).to(device=device, dtype=self.dtype)

    def mapped_bytes(self, device: torch.device) -> int:
        """The bytes of file pages a forward on ``device`` maps into the process (in place only)."""
        return self.entry.nbytes if self.in_place(device) else 0

    def read_ahead(self, device: torch.device) -> None:
        """Start reading the pages into the page cache, mapping nothing (returns at once)."""
        if self.in_place(device):
            self.file.read_ahead([(self.entry.offset, self.entry.nbytes)])

    def populate(self, device: torch.device) -> None:
        if self.in_place(device):
            self.file.populate([(self.entry.offset, self.entry.nbytes)])

    def release(self, device: torch.device) -> None:
        if self.in_place(device):
            self.file.release([(self.entry.offset, self.entry.nbytes)])


def source_value(source: MemoryWeight | FileWeight) -> torch.Tensor:
    """The value of a weight source on the CPU, in its final dtype (a file's read into memory)."""
    if isinstance(source, MemoryWeight):
        return source.tensor
    return source.file.read(source.key).to(source.dtype)


def read_offload_index(folder: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """The offload folder's ``index.json`` (``{}`` when there is none)."""
    path = Path(folder) / INDEX_NAME
    if not path.is_file():
        return {}
    try:
        index = json.loads(path.read_text())
        if not isinstance(index, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        raise ValueError(
            f"cannot read offload index {str(path)!r}: {exc}; delete the folder and offload again"
        ) from exc
    return index


def sources_from_index(
    index: Mapping[str, Mapping[str, Any]], folder: str | os.PathLike[str] | None
) -> dict[str, FileWeight]:
    """A ``FileWeight`` per entry; each file is opened once, its header checked."""
    files: dict[tuple[str, str | None], SafetensorsFile] = {}
    sources: dict[str, FileWeight] = {}
    for name, entry in index.items():
        dtype = torch_dtype(entry["dtype"])
        if "safetensors_file" in entry:
            path = str(entry["safetensors_file"])
            key = str(entry.get("key", entry.get("weight_name", name)))
            if (path, None) not in files:
                if not Path(path).is_file():
                    raise ValueError(f"{name} is offloaded to {path!r}, which does not exist")
                files[(path, None)] = SafetensorsFile(path)
            file = files[(path, None)]
            if key not in file.entries:
                raise ValueError(f"{name} is offloaded to {path!r} under key {key!r}, which that file does not hold")
        else:
            if folder is None:
                raise ValueError(f"{name} is offloaded to a raw .dat file: pass the offload folder that holds it")
            path = str(Path(folder) / f"{name}.dat")
            if not Path(path).is_file():
                raise ValueError(f"{name} is offloaded to {path!r}, which does not exist")
            key = name
            # Accelerate stores bfloat16 as int16 bits: the bytes are the same either way.
            files[(path, key)] = SafetensorsFile.raw(path, key, dtype, tuple(int(d) for d in entry["shape"]))
            file = files[(path, key)]
        sources[name] = FileWeight(file, key, dtype)
    for file in files.values():
        file.map_only()
    return sources


def write_offload_files(
    tensors: Mapping[str, torch.Tensor], folder: str | os.PathLike[str], stem: str
) -> dict[str, dict[str, Any]]:
    """Save ``tensors`` as ``<folder>/<stem>.safetensors`` (shared tensors once) and index them.

    The file is written under a temporary name and renamed, and the index merged and replaced
    the same way, so an interrupted write never leaves a half-written file under a real name.
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}.safetensors"
    ours = {str(entry.get("safetensors_file")) for entry in read_offload_index(folder).values()}
    if path.exists() and str(path.resolve()) not in ours:
        # Replace only what an earlier offload into this folder wrote, never a file of the user's.
        raise ValueError(
            f"{str(path)!r} already exists and is not listed in the folder's index.json: offload into an "
            "empty folder, or delete it first"
        )
    keys: dict[int, str] = {}
    unique: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        key = keys.setdefault(id(tensor), name)
        if key == name:
            unique[name] = tensor.detach().to("cpu").contiguous()
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(unique, str(tmp))
    os.replace(tmp, path)
    entries = {
        name: {
            "safetensors_file": str(path.resolve()),
            "key": keys[id(tensor)],
            "dtype": str(tensor.dtype).removeprefix("torch."),
            "shape": list(tensor.shape),
        }
        for name, tensor in tensors.items()
    }
    write_offload_index(folder, entries)
    return entries


def write_offload_index(folder: Path, entries: Mapping[str, Any]) -> None:
    """Merge ``entries`` into ``<folder>/index.json``, replacing it atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    merged = read_offload_index(folder)
    merged.update(entries)
    path = folder / INDEX_NAME
    tmp = path.with_name(f".{INDEX_NAME}.tmp")
    tmp.write_text(json.dumps(merged, indent=2, sort_keys=True))
    os.replace(tmp, path)
