"""Accelerate's offload-folder functions: one raw ``<name>.dat`` file per tensor plus ``index.json``.

``offload_weight`` writes a tensor's bytes as they are (bfloat16 and the float8 types included: the
bytes need no conversion) and records ``{"dtype", "shape"}`` in the index; ``offload_state_dict``
does it for a whole state dict and merges the index into the folder's. ``OffloadedWeightsLoader``
reads a state dict back lazily, from memory first, then from the folder's files, through the same
weight sources the dispatcher uses (``sources_from_index``), so an index written by x's own
offloading (safetensors files) is read too.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from x_bigmodel.devices.tensor_placement import set_module_tensor_to_device, torch_dtype
from x_bigmodel.files.safetensors_file import SafetensorsFile
from x_bigmodel.offload.weights import (
    FileWeight,
    MemoryWeight,
    read_offload_index,
    source_value,
    sources_from_index,
    write_offload_index,
)

__all__ = [
    "OffloadedWeightsLoader",
    "PrefixedDataset",
    "extract_submodules_state_dict",
    "load_offloaded_weight",
    "load_offloaded_weights",
    "offload_state_dict",
    "offload_weight",
    "save_offload_index",
]


def offload_weight(
    weight: torch.Tensor,
    weight_name: str,
    offload_folder: str | os.PathLike[str],
    index: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``weight``'s bytes to ``<offload_folder>/<weight_name>.dat`` and record its dtype and
    shape under ``weight_name`` in ``index`` (returned; a new dict when ``None``).

    The file is written under a temporary name and renamed, so it is never seen half-written.
    """
    folder = Path(offload_folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{weight_name}.dat"
    data = weight.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        data.numpy().tofile(handle)
    os.replace(tmp, path)
    if index is None:
        index = {}
    index[weight_name] = {"dtype": str(weight.dtype).removeprefix("torch."), "shape": list(weight.shape)}
    return index


def load_offloaded_weight(weight_file: str | os.PathLike[str], weight_info: Mapping[str, Any]) -> torch.Tensor:
    """The tensor in raw file ``weight_file`` (as ``offload_weight`` wrote it), with the dtype and
    shape ``weight_info`` gives; a tensor of its own (the file is not kept open).

    Raises:
        ValueError: the file is shorter than the tensor needs.
    """
    dtype = torch_dtype(str(weight_info["dtype"]))
    shape = tuple(int(d) for d in weight_info["shape"])
    name = Path(weight_file).name.removesuffix(".dat")
    with SafetensorsFile.raw(weight_file, name, dtype, shape) as file:
        return file.read(name)


def offload_state_dict(save_dir: str | os.PathLike[str], state_dict: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """Write every tensor of ``state_dict`` to ``save_dir`` (``offload_weight``) and merge their
    entries into ``save_dir/index.json``; returns the entries written."""
    index: dict[str, Any] = {}
    for name, tensor in state_dict.items():
        offload_weight(tensor, name, save_dir, index)
    write_offload_index(Path(save_dir), index)
    return index


def save_offload_index(index: Mapping[str, Any] | None, offload_folder: str | os.PathLike[str]) -> None:
    """Merge ``index`` into ``<offload_folder>/index.json`` (replaced whole, never half-written);
    an empty or ``None`` index writes nothing."""
    if index:
        write_offload_index(Path(offload_folder), index)


def load_offloaded_weights(
    model: torch.nn.Module, index: Mapping[str, Mapping[str, Any]] | None, offload_folder: str | os.PathLike[str]
) -> None:
    """Put each tensor ``index`` names, read from its ``.dat`` file in ``offload_folder``, into ``model`` on the CPU.

    Raises:
        ValueError: the index holds bitsandbytes 8-bit statistics (``*.SCB``), which x does not load.
        AttributeError: an entry names no parameter or buffer of ``model``.
    """
    entries = dict(index or {})
    if any("SCB" in name for name in entries):
        raise ValueError("this offload index holds bitsandbytes 8-bit statistics (SCB), which x does not load")
    for name, info in entries.items():
        value = load_offloaded_weight(Path(offload_folder) / f"{name}.dat", info)
        set_module_tensor_to_device(model, name, "cpu", value=value)


class OffloadedWeightsLoader(Mapping[str, torch.Tensor]):
    """A read-only state dict over tensors in memory (``state_dict``) and in an offload folder
    (``save_folder``, or ``index`` with its paths), each read when asked for.

    Args:
        state_dict: tensors in memory; they win over the folder's of the same name.
        save_folder: the offload folder (its ``index.json`` is read unless ``index`` is given).
        index: the offload index (raw ``.dat`` entries need ``save_folder``).
        device: where tensors read from files are put (default: the CPU).

    Raises:
        ValueError: none of ``state_dict``, ``save_folder`` and ``index`` is given, or the index
            names a file that is missing.
    """

    def __init__(
        self,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        save_folder: str | os.PathLike[str] | None = None,
        index: Mapping[str, Mapping[str, Any]] | None = None,
        device: int | str | torch.device | None = None,
    ) -> None:
        if state_dict is None and save_folder is None and index is None:
            raise ValueError("OffloadedWeightsLoader needs a state_dict, a save_folder or an index")
        self.state_dict = dict(state_dict or {})
        self.save_folder = save_folder
        if index is None and save_folder is not None:
            index = read_offload_index(save_folder)
        self.index = dict(index or {})
        on_disk = {name: entry for name, entry in self.index.items() if name not in self.state_dict}
        self._sources: dict[str, FileWeight] = sources_from_index(on_disk, save_folder)
        self.all_keys = list(self.state_dict) + list(on_disk)
        self.device = device

    def source(self, key: str) -> MemoryWeight | FileWeight:
        """Where ``key``'s value lives, as a weight source the offloading hooks read from."""
        if key in self.state_dict:
            return MemoryWeight(self.state_dict[key])
        return self._sources[key]

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.state_dict:
            return self.state_dict[key]
        value = source_value(self._sources[key])
        return value if self.device is None else value.to(self.device)

    def __iter__(self) -> Iterator[str]:
        return iter(self.all_keys)

    def __len__(self) -> int:
        return len(self.all_keys)


class PrefixedDataset(Mapping[str, torch.Tensor]):
    """The entries of ``dataset`` whose names start with ``prefix``, by the name after it."""

    def __init__(self, dataset: Mapping[str, torch.Tensor], prefix: str) -> None:
        self.dataset, self.prefix = dataset, prefix

    def source(self, key: str) -> MemoryWeight | FileWeight:
        source = getattr(self.dataset, "source", None)
        if source is not None:
            return source(self.prefix + key)
        return MemoryWeight(self.dataset[self.prefix + key])

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.dataset[self.prefix + key]

    def __iter__(self) -> Iterator[str]:
        return iter([key[len(self.prefix) :] for key in self.dataset if key.startswith(self.prefix)])

    def __len__(self) -> int:
        return sum(1 for key in self.dataset if key.startswith(self.prefix))


def extract_submodules_state_dict(state_dict: Mapping[str, Any], submodule_names: Iterable[str]) -> dict[str, Any]:
    """The entries of ``state_dict`` that belong to one of ``submodule_names`` (the name itself, or
    a name below it: ``"a.1"`` takes ``"a.1.weight"``, not ``"a.10.weight"``)."""
    names = list(submodule_names)
    return {
        key: value
        for key, value in state_dict.items()
        if any(key == name or key.startswith(f"{name}.") or not name for name in names)
    }
