"""Model weights as safetensors files (or, asked for, ``pytorch_model.bin`` files): one file, or
shards with a Hugging Face style index.

Tensors that share storage (tied embeddings) are stored once; the index and the file metadata
name the aliases so loading restores the tie (a ``.bin`` file keeps the tie as torch.save does,
one storage). Every file is written atomically, and shards left by an earlier save with a
different shard count are removed only after the new set is complete.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from x_common.sizes import parse_size
from x_runtime.io.atomic import write_file_atomic
from x_runtime.io.files import torch_save

__all__ = [
    "SAFE_WEIGHTS_INDEX_NAME",
    "SAFE_WEIGHTS_NAME",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "load_state_dict_files",
    "load_tensors_file",
    "save_object",
    "save_state_dict_files",
    "save_tensors_file",
]

SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
WEIGHTS_NAME = "pytorch_model.bin"  # Accelerate's and transformers' names for torch.save weights
WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"
_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
_BIN_SHARD = re.compile(r"pytorch_model-\d{5}-of-\d{5}\.bin")


def _storage_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    return (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.shape, tensor.stride())


def _dedupe(state_dict: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Unique tensors by name, and ``alias -> kept name`` for tensors that are the same view."""
    kept: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[Any, ...], str] = {}
    storages: set[tuple[Any, int]] = set()
    for name, tensor in state_dict.items():
        key = _storage_key(tensor)
        if tensor.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        storage = (tensor.device, tensor.untyped_storage().data_ptr())
        # safetensors refuses tensors that overlap in memory (e.g. slices of one fused weight).
        kept[name] = tensor.detach().clone() if storage in storages else tensor.detach().contiguous()
        storages.add(storage)
    return kept, aliases


def _shards(tensors: dict[str, torch.Tensor], limit: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def save_tensors_file(state_dict: Mapping[str, torch.Tensor], path: str | os.PathLike[str]) -> dict[str, str]:
    """One safetensors file holding ``state_dict``, shared tensors once (atomic write).

    Returns:
        ``alias -> kept name`` for the tensors stored once under another name (the file's
        ``aliases`` metadata, which ``load_tensors_file`` reads to restore them).
    """
    tensors, aliases = _dedupe(state_dict)
    tensors = {name: tensor.cpu() for name, tensor in tensors.items()}
    metadata = {"format": "pt", "aliases": json.dumps(aliases)}
    write_file_atomic(Path(path), lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
    return aliases


def save_object(obj: Any, path: str | os.PathLike[str], *, safe_serialization: bool = False) -> None:
    """``torch.save`` (or safetensors for a dict of tensors), complete or not at all."""
    if safe_serialization:
        save_tensors_file(obj, path)
    else:
        torch_save(obj, Path(path))


def load_tensors_file(path: str | Path, *, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Read a file written by ``save_tensors_file``; aliases share their tensor again."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            aliases = json.loads((handle.metadata() or {}).get("aliases", "{}"))
        state = load_file(str(path), device=str(device))
    except SafetensorError as exc:
        raise ValueError(
            f"cannot read {path}: {str(exc).splitlines()[0]}; the file is corrupt or truncated (an interrupted "
            "copy?): load an earlier checkpoint or copy it again"
        ) from None
    for alias, target in aliases.items():
        state[alias] = state[target]
    return state


def save_state_dict_files(
    state_dict: Mapping[str, torch.Tensor],
    directory: str | os.PathLike[str],
    *,
    max_shard_size: int | str = "10GB",
    safe_serialization: bool = True,
) -> list[Path]:
    """Write ``state_dict`` into ``directory`` as safetensors (``.bin``: ``safe_serialization=False``).

    Returns the files written. The ``.bin`` files hold plain tensors only, so
    ``torch.load(path, weights_only=True)`` reads them.

    Examples:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> [p.name for p in save_state_dict_files({"w": torch.ones(4)}, folder)]
        ['model.safetensors']
        >>> [p.name for p in save_state_dict_files({"w": torch.ones(4)}, folder, safe_serialization=False)]
        ['pytorch_model.bin']
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    limit = parse_size(max_shard_size) if isinstance(max_shard_size, str) else int(max_shard_size)
    if limit <= 0:
        raise ValueError(f"max_shard_size must be positive, got {max_shard_size!r}")
    tensors, aliases = _dedupe(state_dict)
    tensors = {name: tensor.cpu() for name, tensor in tensors.items()}
    shards = _shards(tensors, limit)
    if safe_serialization:
        single, index_name, shard_name, pattern = (
            SAFE_WEIGHTS_NAME,
            SAFE_WEIGHTS_INDEX_NAME,
            "model-{}-of-{}.safetensors",
            _SHARD,
        )
        metadata = {"format": "pt", "aliases": json.dumps(aliases)}
        write_shard: Callable[[dict[str, torch.Tensor], Path], None] = functools.partial(_save_shard, metadata=metadata)
    else:
        single, index_name, shard_name, pattern = (
            WEIGHTS_NAME,
            WEIGHTS_INDEX_NAME,
            "pytorch_model-{}-of-{}.bin",
            _BIN_SHARD,
        )
        # An alias is the same tensor object in its target's file: torch.save stores it once, tied.
        for shard in shards:
            shard.update({alias: shard[target] for alias, target in aliases.items() if target in shard})
        write_shard = _torch_shard
    written: list[Path] = []
    if len(shards) == 1:
        path = directory / single
        write_file_atomic(path, functools.partial(write_shard, shards[0]))
        written.append(path)
        stale = [directory / index_name, *(p for p in directory.iterdir() if pattern.fullmatch(p.name))]
    else:
        weight_map: dict[str, str] = {}
        for number, shard in enumerate(shards, start=1):
            name = shard_name.format(f"{number:05d}", f"{len(shards):05d}")
            path = directory / name
            write_file_atomic(path, functools.partial(write_shard, shard))
            written.append(path)
            weight_map.update(dict.fromkeys(shard, name))
        weight_map.update({alias: weight_map[target] for alias, target in aliases.items()})
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total, "aliases": aliases}, "weight_map": dict(sorted(weight_map.items()))}
        index_path = directory / index_name
        write_file_atomic(index_path, lambda tmp: tmp.write_text(json.dumps(index, indent=2) + "\n"))
        written.append(index_path)
        keep = {p.name for p in written}
        stale = [directory / single, *(p for p in directory.iterdir() if pattern.fullmatch(p.name))]
        stale = [p for p in stale if p.name not in keep]
    for path in stale:
        if path.exists():
            path.unlink()
    return written


def load_state_dict_files(directory: str | Path, *, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Read back what ``save_state_dict_files`` wrote, aliases included (sharing the tensor)."""
    directory = Path(directory)
    index_path = directory / SAFE_WEIGHTS_INDEX_NAME
    single = directory / SAFE_WEIGHTS_NAME
    if single.is_file():
        return load_tensors_file(single, device=device)
    if index_path.is_file():
        index = json.loads(index_path.read_text())
        aliases = index.get("metadata", {}).get("aliases", {})
        state = {}
        for name in sorted(set(index["weight_map"].values())):
            state.update(load_file(str(directory / name), device=str(device)))
    else:
        raise FileNotFoundError(f"no {SAFE_WEIGHTS_NAME} or {SAFE_WEIGHTS_INDEX_NAME} in {directory}")
    for alias, target in aliases.items():
        state[alias] = state[target]
    return state


def _save_shard(shard: dict[str, torch.Tensor], tmp: Path, *, metadata: dict[str, str] | None) -> None:
    save_file(shard, str(tmp), metadata=metadata)


def _torch_shard(shard: dict[str, torch.Tensor], tmp: Path) -> None:
    with open(tmp, "wb") as handle:  # a Python file: a full disk raises OSError(ENOSPC)
        torch.save(shard, handle)
