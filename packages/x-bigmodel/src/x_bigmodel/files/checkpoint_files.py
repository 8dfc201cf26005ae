"""Which files a checkpoint is, and reading their tensors one at a time.

A checkpoint is one safetensors file, a sharded ``*.index.json``, or a folder holding either; torch
``.bin`` files are read only with ``weights_only=True`` and a memory map. Corrupt or truncated
files and missing shards are reported by name.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from x_bigmodel.devices.tensor_placement import release_pages
from x_bigmodel.files.device_staging import DeviceStaging
from x_bigmodel.files.safetensors_file import SafetensorsFile

SAFETENSORS_SUFFIX = ".safetensors"


_TORCH_SUFFIXES = (".bin", ".pt", ".pth")
# Pages are faulted in steps this large: big enough to keep the kernel's readahead streaming,
# small enough for a progress bar to move smoothly (~50 ms each from page cache or a fast disk).
_MAP_IN_STEP = 64 * 2**20


def resolve_checkpoint_files(checkpoint: str | os.PathLike[str]) -> dict[Path, list[str] | None]:
    """The files of a checkpoint, each with the keys to read from it (``None``: all of its keys).

    ``checkpoint`` may be a ``.safetensors`` file, a ``.bin``/``.pt`` file, a sharded checkpoint's
    ``*.index.json`` (Hugging Face layout: ``{"weight_map": {name: shard_file}}``), or a folder
    holding one of these. In a folder an index wins over a single file, and a safetensors index
    over a torch one.

    Raises:
        ValueError: nothing loadable is found, the choice is ambiguous, the index is malformed,
            or the index names a shard that does not exist.

    Examples:
        >>> import tempfile
        >>> from safetensors.torch import save_file
        >>> folder = Path(tempfile.mkdtemp())
        >>> save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))
        >>> [(p.name, keys) for p, keys in resolve_checkpoint_files(folder).items()]
        [('model.safetensors', None)]
    """
    path = Path(checkpoint)
    if path.is_dir():
        path = _pick_in_folder(path)
    elif not path.is_file():
        raise ValueError(f"checkpoint {str(path)!r} does not exist")
    if path.name.endswith(".json"):
        return _read_index(path)
    if not path.name.endswith((SAFETENSORS_SUFFIX, *_TORCH_SUFFIXES)):
        raise ValueError(f"checkpoint {str(path)!r} is not a .safetensors, .bin, .pt or .index.json file")
    return {path: None}


def _pick_in_folder(folder: Path) -> Path:
    indexes = sorted(folder.glob("*.index.json"))
    safe_indexes = [p for p in indexes if p.name.endswith(".safetensors.index.json")]
    candidates = safe_indexes or indexes
    if len(candidates) > 1:
        names = ", ".join(p.name for p in candidates)
        raise ValueError(f"checkpoint folder {str(folder)!r} holds several index files ({names}); pass one of them")
    if candidates:
        return candidates[0]
    offloaded = _offload_storage(folder)
    # First the files no offload index names, then (an offload that reads the checkpoint in place
    # names the checkpoint itself) any.
    for skip in (offloaded, set()) if offloaded else (set(),):
        for pattern in ("*.safetensors", *(f"*{s}" for s in _TORCH_SUFFIXES)):
            found = [p for p in sorted(folder.glob(pattern)) if str(p.resolve()) not in skip]
            if len(found) == 1:
                return found[0]
            if len(found) > 1:
                names = ", ".join(p.name for p in found)
                raise ValueError(
                    f"checkpoint folder {str(folder)!r} holds several {pattern} files ({names}) but no "
                    "*.index.json saying which tensor is where; pass the file or add an index"
                )
    raise ValueError(
        f"checkpoint folder {str(folder)!r} holds no *.index.json, *.safetensors, *.bin or *.pt file to load"
    )


def _offload_storage(folder: Path) -> set[str]:
    """Files an offload into ``folder`` wrote for its weights (named in its ``index.json``).

    A folder can be both a checkpoint and an offload folder (Accelerate's tests save, offload into
    the same folder, save again): the offload's own ``<stem>.safetensors`` (written for a ``.bin``
    checkpoint) holds a few weights only and must not be taken for the checkpoint.
    """
    # Read here, not with offload.read_offload_index: files/ sits below offload/ in the layers.
    try:
        index = json.loads((folder / "index.json").read_text())
    except (OSError, ValueError):  # no offload index, or not one: nothing to leave out
        return set()
    if not isinstance(index, dict):
        return set()
    return {
        str(Path(entry["safetensors_file"]).resolve())
        for entry in index.values()
        if isinstance(entry, dict) and isinstance(entry.get("safetensors_file"), str)
    }


def _read_index(index_path: Path) -> dict[Path, list[str] | None]:
    try:
        index = json.loads(index_path.read_text())
        weight_map = index.get("weight_map", index) if isinstance(index, dict) else index
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise TypeError("weight_map must map tensor names to shard file names")
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ValueError(
            f"cannot read sharded checkpoint index {str(index_path)!r}: {exc}; expected "
            '{"metadata": {...}, "weight_map": {tensor_name: shard_file}}'
        ) from exc
    files: dict[Path, list[str] | None] = {}
    for name, shard in weight_map.items():
        shard_path = index_path.parent / shard
        if shard_path not in files:
            if not shard_path.is_file():
                raise ValueError(
                    f"sharded checkpoint index {str(index_path)!r} names shard {shard!r}, "
                    f"which does not exist at {str(shard_path)!r} (incomplete download?)"
                )
            files[shard_path] = []
        files[shard_path].append(name)  # type: ignore[union-attr]
    return files


class CheckpointReader:
    """One open checkpoint file; ``load`` returns one tensor on its target device and dtype."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.mmapped = path.name.endswith(SAFETENSORS_SUFFIX)
        self._file: SafetensorsFile | None = None
        self._state: dict[str, Any] | None = None

    def __enter__(self) -> CheckpointReader:
        if self.mmapped:
            try:
                self._file = SafetensorsFile(self.path)
            except OSError as exc:
                raise _unreadable(self.path, exc) from exc
        else:
            try:
                state = torch.load(self.path, map_location="cpu", weights_only=True, mmap=True)
            except Exception as exc:
                raise _unreadable(self.path, exc) from exc
            if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
                raise ValueError(f"{str(self.path)!r} does not hold a state dict (a dict of tensors)")
            self._state = state
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._file is not None:
            self._file.close()
        self._file = self._state = None

    def keys(self) -> list[str]:
        return self._file.keys() if self._file is not None else list(self._state or {})

    def shape(self, key: str) -> tuple[int, ...]:
        if self._file is not None:
            return self._file.entry(key).shape
        return tuple(self._state[key].shape)  # type: ignore[index]

    def torch_dtype(self, key: str) -> torch.dtype:
        if self._file is not None:
            return self._file.entry(key).dtype  # type: ignore[return-value]
        return self._state[key].dtype  # type: ignore[index]

    def dtype(self, key: str) -> str:
        return str(self.torch_dtype(key)).removeprefix("torch.")

    def get(self, key: str) -> torch.Tensor:
        """The tensor as stored; from a torch file it is backed by the file's mapped pages."""
        if self._file is not None:
            return self._file.read(key)
        return self._state[key]  # type: ignore[index]

    def can_map(self, key: str, device: torch.device | str, dtype: torch.dtype) -> bool:
        """Whether ``key`` can be used in place, as the file's mapped pages."""
        return self._file is not None and torch.device(device).type == "cpu" and self.torch_dtype(key) == dtype

    def map_in(self, keys: list[str], advance: Callable[[int], None] | None = None) -> None:
        """Fault the pages of ``keys`` in, adjacent tensors together, calling ``advance`` with the
        bytes of each ``_MAP_IN_STEP`` faulted (so a progress bar moves within a shard)."""
        if self._file is None or not keys:
            return
        ranges: list[tuple[int, int]] = []
        for key in sorted(keys, key=self.offset):
            entry = self._file.entries[key]
            if ranges and ranges[-1][0] + ranges[-1][1] >= entry.offset - 64:
                start = ranges[-1][0]
                ranges[-1] = (start, entry.offset + entry.nbytes - start)
            else:
                ranges.append((entry.offset, entry.nbytes))
        for offset, nbytes in ranges:
            for step in range(offset, offset + nbytes, _MAP_IN_STEP):
                size = min(_MAP_IN_STEP, offset + nbytes - step)
                self._file.populate([(step, size)])
                if advance is not None:
                    advance(size)

    def nbytes(self, key: str) -> int:
        """The bytes ``key`` takes in the file (as stored)."""
        if self._file is not None:
            return self._file.entries[key].nbytes
        return self._state[key].nbytes  # type: ignore[index]

    def load(
        self,
        key: str,
        device: torch.device,
        dtype: torch.dtype,
        mapped: bool = False,
        staging: DeviceStaging | None = None,
    ) -> torch.Tensor:
        """``key`` on ``device`` in ``dtype``: the file's pages when ``mapped`` and it can be used
        in place, else memory of its own, with at most one copy beyond the read. With ``staging``,
        a CUDA tensor is read through its pinned chunks straight to the GPU (and cast there)."""
        if self._file is not None:
            if mapped and self.can_map(key, device, dtype):
                return self._file.view(key)
            if staging is not None and device.type == "cuda":
                return staging.read(self._file, key, device).to(dtype=dtype)
            return self._file.read(key).to(device=device, dtype=dtype)
        value = self._state[key]  # type: ignore[index]
        # copy=True: the model must own its memory, not keep the file's mapped pages.
        new = value.to(device=device, dtype=dtype, copy=True)
        release_pages(value, new)
        return new

    def offset(self, key: str) -> int:
        return self._file.entries[key].offset if self._file is not None else 0


def open_checkpoint(path: Path) -> CheckpointReader:
    return CheckpointReader(path)


def _unreadable(path: Path, exc: BaseException) -> ValueError:
    if path.name.endswith(SAFETENSORS_SUFFIX):
        hint = "the file is corrupt or truncated (an interrupted download or save?); download or save it again"
        return ValueError(f"cannot read checkpoint file {str(path)!r}: {_first_line(exc)}; {hint}")
    if isinstance(exc, pickle.UnpicklingError):
        # torch's own text runs to several lines and advises weights_only=False, which we never do.
        return ValueError(
            f"cannot read checkpoint file {str(path)!r}: it holds objects other than tensors, which "
            "torch.load(weights_only=True) refuses to unpickle; convert it to safetensors"
        )
    hint = (
        "it is corrupt or truncated (an interrupted download or save?), or not a torch file; convert it to safetensors"
    )
    return ValueError(f"cannot read checkpoint file {str(path)!r}: {_first_line(exc)}; {hint}")


def _first_line(exc: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    return text.splitlines()[0].rstrip(" :.") if text else type(exc).__name__
