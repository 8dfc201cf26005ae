"""Stream a checkpoint into a (possibly meta-device) model, one tensor at a time.

The loader never builds the checkpoint's state dict. Each safetensors tensor is read with
``preadv`` straight into the tensor that will hold it (the same single copy from the page cache
that reading the file costs, and no mapped file pages left in RSS), then converted or moved to
the device the ``device_map`` names when it must be. Tensors are read in file order. Peak memory
is therefore the model plus at most one tensor, not the model plus a shard (or the state dict).

Where we differ from Accelerate's ``load_checkpoint_in_model``:

* keys, shapes and devices are checked for the whole checkpoint (from the file headers) before any
  tensor is loaded, so a bad checkpoint fails fast and leaves the model untouched;
* missing keys are an error unless ``allow_missing_keys=True`` (Accelerate loads silently);
* tensors mapped to ``"disk"`` that already live in a safetensors file are not copied: the
  returned offload index points at the file and key, to be read in place by memory map;
* ``.bin``/``.pt`` files are read only with ``torch.load(weights_only=True, mmap=True)``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from x_bigmodel.checkpoint_files import (
    _SAFETENSORS_SUFFIX,
    _open,
    resolve_checkpoint_files,
)
from x_bigmodel.offload_weights import write_offload_files, write_offload_index
from x_bigmodel.tensor_placement import (
    _as_device,
    _assign_all,
    _target_dtype,
    _wrap_like,
    set_module_tensor_to_device,
    torch_dtype,
)

__all__ = [
    "DeviceMap",
    "OffloadIndex",
    "load_checkpoint_in_model",
    "resolve_checkpoint_files",
    "set_module_tensor_to_device",
]

DeviceMap = Mapping[str, int | str | torch.device]
# {param_name: {"safetensors_file": path, "key": name_in_file, "dtype": "float16", "shape": [..]}}
OffloadIndex = dict[str, dict[str, Any]]

_MAX_LISTED = 10


def load_checkpoint_in_model(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: DeviceMap | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    dtype: str | torch.dtype | None = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: Iterable[str] | None = None,
    strict: bool = False,
    allow_missing_keys: bool = False,
    show_progress: bool = True,
    mmap: bool = True,
) -> OffloadIndex:
    """Load ``checkpoint`` into ``model``, streaming each tensor straight to its device.

    Parameters and buffers are replaced, so ``model`` may be built on the meta device (under
    ``init_empty_weights``). Tied weights stay tied: a tensor stored once is assigned to all of
    its aliases. Keys, shapes and devices are checked from the file headers before anything is
    loaded, so on error the model is unchanged.

    Args:
        model: the model to fill.
        checkpoint: a ``.safetensors`` file, a sharded checkpoint's ``*.index.json``, a folder
            holding either, or a ``.bin``/``.pt`` file (read with ``weights_only=True, mmap=True``).
            See ``resolve_checkpoint_files``.
        device_map: module-name prefix to device (``"cpu"``, an int GPU id, ``"cuda:1"``,
            ``"disk"``); the longest prefix of a tensor's name wins, ``""`` matches everything.
            Default: each tensor stays on its current device (CPU for meta tensors).
        offload_folder: where ``index.json`` for the ``"disk"`` tensors is written (merged into an
            existing one). Tensors from ``.bin`` files mapped to disk are saved here as
            safetensors, so it is required for those; safetensors weights are never copied.
        dtype: cast floating tensors to this dtype (integer and bool tensors keep theirs).
            Default: a floating tensor takes the dtype the model declares for it.
        offload_state_dict: accepted for Accelerate compatibility; no effect, since the state dict
            is never held in memory.
        offload_buffers: also leave buffers of ``"disk"`` modules on disk; by default they are
            loaded to CPU (they are small and read on every forward).
        keep_in_fp32_modules: module names (dotted, matched as whole name parts anywhere in the
            tensor name, like Transformers' ``_keep_in_fp32_modules``) whose floating tensors are
            loaded as float32 whatever ``dtype`` says.
        strict: raise on checkpoint keys the model does not have; by default they are skipped
            with a warning.
        allow_missing_keys: warn instead of raising when model tensors are not in the checkpoint
            (they keep their current value, or stay on meta).
        show_progress: a tqdm bar over the checkpoint files on stderr, when tqdm is installed and
            this is the main process (rank 0).
        mmap: CPU tensors kept in the checkpoint's dtype are the safetensors file's own pages,
            mapped privately and faulted in during the call (no copy: processes loading the same
            file share its page cache, and the first forward pays nothing). The mapping is
            private, so writes to the weights never reach the file; but a file rewritten in place
            (same inode, e.g. ``cp other.safetensors model.safetensors``) while the model lives
            changes its weights, or makes reading them fail (SIGBUS) if it got shorter. Writing a
            new file and renaming it over the old one (what ``safetensors.save_file`` and
            ``save_pretrained`` do) is safe. Pass ``mmap=False`` to copy every tensor into memory
            the model owns instead.

    Returns:
        The offload index of the tensors mapped to ``"disk"`` and not loaded (those stay as they
        were, on meta for an empty model): ``{name: {"safetensors_file", "key", "dtype", "shape"}}``
        where ``dtype`` is the dtype to convert to after reading. Empty without disk entries.

    Raises:
        ValueError: missing keys (unless allowed), unexpected keys when ``strict``, a shape
            mismatch, a tensor with no device in ``device_map``, a corrupt or truncated file, or
            an index naming a missing shard. The message names the tensors or the file.

    Examples:
        >>> import tempfile
        >>> from safetensors.torch import save_file
        >>> folder = Path(tempfile.mkdtemp())
        >>> save_file({"weight": torch.ones(3, 2), "bias": torch.zeros(3)}, str(folder / "model.safetensors"))
        >>> with torch.device("meta"):
        ...     layer = nn.Linear(2, 3)
        >>> load_checkpoint_in_model(layer, folder, dtype="float16", show_progress=False)
        {}
        >>> layer.weight.dtype, layer.weight.device.type, float(layer.weight.detach().sum())
        (torch.float16, 'cpu', 6.0)
    """
    del offload_state_dict  # nothing to offload: no state dict is built
    files = resolve_checkpoint_files(checkpoint)
    target_dtype = torch_dtype(dtype) if dtype is not None else None
    fp32_modules = [tuple(m.split(".")) for m in keep_in_fp32_modules or ()]
    expected = model.state_dict(keep_vars=True)
    aliases = _alias_groups(expected)
    buffer_names = {name for name, _ in model.named_buffers(remove_duplicate=False)}
    devices = _normalise_device_map(device_map)

    plan, unexpected = _plan(files, expected, devices)
    _check_keys(model, expected, aliases, plan, unexpected, strict, allow_missing_keys)

    if offload_folder is None:
        for name, entry in plan.items():
            on_disk = _device_for(name, devices, expected[name]) == "disk"
            if (
                on_disk
                and not entry[0].name.endswith(_SAFETENSORS_SUFFIX)
                and (offload_buffers or name not in buffer_names)
            ):
                raise ValueError(
                    f"{name} is mapped to 'disk' but comes from a torch file, which cannot be read in place: "
                    "pass offload_folder= to save it there as safetensors"
                )

    offload_index: OffloadIndex = {}
    by_file: dict[Path, list[str]] = {}
    for name, entry in plan.items():
        by_file.setdefault(entry[0], []).append(name)
    for path in _progress(list(by_file), show_progress):
        names = by_file[path]
        to_load = []
        for name in names:
            device = _device_for(name, devices, expected[name])
            tensor_dtype = _planned_dtype(name, expected[name], plan[name], target_dtype, fp32_modules)
            if device == "disk" and (offload_buffers or name not in buffer_names):
                offload_index[name] = {"dtype": str(tensor_dtype).removeprefix("torch."), "shape": list(plan[name][2])}
                if path.name.endswith(_SAFETENSORS_SUFFIX):
                    offload_index[name].update(safetensors_file=str(path.resolve()), key=plan[name][1])
                continue
            to_load.append((name, torch.device("cpu") if device == "disk" else device))
        with _open(path) as reader:
            # In file order: the reads then go through the file front to back.
            ordered = sorted(to_load, key=lambda item: reader.offset(plan[item[0]][1]))
            dtypes = [_planned_dtype(n, expected[n], plan[n], target_dtype, fp32_modules) for n, _ in ordered]
            if mmap:
                reader.map_in(
                    [plan[n][1] for (n, d), t in zip(ordered, dtypes, strict=True) if reader.can_map(plan[n][1], d, t)]
                )
            for (name, device), dtype in zip(ordered, dtypes, strict=True):
                new = reader.load(plan[name][1], device, dtype, mapped=mmap)
                _assign_all(model, aliases[name], _wrap_like(expected[name], new))
            unsaved = [n for n in names if n in offload_index and "safetensors_file" not in offload_index[n]]
            if unsaved:
                # A torch file cannot be read in place: its disk tensors go to one safetensors file.
                assert offload_folder is not None  # checked before loading
                saved = write_offload_files({n: reader.get(plan[n][1]) for n in unsaved}, offload_folder, path.stem)
                for name in unsaved:
                    offload_index[name].update(safetensors_file=saved[name]["safetensors_file"], key=saved[name]["key"])
    if offload_folder is not None and offload_index:
        write_offload_index(Path(offload_folder), offload_index)
    return offload_index


# --- checkpoint discovery ---------------------------------------------------------------------


# --- reading files ----------------------------------------------------------------------------


# --- planning and checks ----------------------------------------------------------------------


def _plan(
    files: Mapping[Path, list[str] | None],
    expected: Mapping[str, torch.Tensor],
    devices: dict[str, torch.device | str] | None,
) -> tuple[dict[str, tuple[Path, str, tuple[int, ...], str]], list[str]]:
    """Map each model tensor in the checkpoint to (file, key, shape, file dtype); list the rest."""
    plan: dict[str, tuple[Path, str, tuple[int, ...], str]] = {}
    unexpected: list[str] = []
    for path, wanted in files.items():
        with _open(path) as reader:
            present = reader.keys()
            keys = present if wanted is None else wanted
            missing_in_file = set(keys) - set(present)
            if missing_in_file:
                raise ValueError(
                    f"checkpoint file {str(path)!r} lacks {_listing(sorted(missing_in_file))} "
                    "that the index says it holds"
                )
            for key in keys:
                if key not in expected:
                    unexpected.append(key)
                    continue
                shape = reader.shape(key)
                if shape != tuple(expected[key].shape):
                    raise ValueError(
                        f"shape mismatch for {key}: the checkpoint ({path.name}) has {shape}, "
                        f"the model expects {tuple(expected[key].shape)}"
                    )
                _device_for(key, devices, expected[key])  # fail before loading if unplaced
                plan[key] = (path, key, shape, reader.dtype(key))
    return plan, unexpected


def _check_keys(
    model: nn.Module,
    expected: Mapping[str, torch.Tensor],
    aliases: Mapping[str, list[str]],
    plan: Mapping[str, object],
    unexpected: list[str],
    strict: bool,
    allow_missing_keys: bool,
) -> None:
    name = type(model).__name__
    if unexpected:
        message = f"the checkpoint has {_listing(unexpected)} that {name} does not have"
        if strict:
            raise ValueError(message + " (strict=True)")
        warnings.warn(message + "; they are skipped", stacklevel=3)
    covered = {alias for key in plan for alias in aliases[key]}
    missing = [key for key in expected if key not in covered]
    if missing:
        message = f"{name} has {_listing(missing)} that the checkpoint lacks"
        if not allow_missing_keys:
            raise ValueError(message + "; pass allow_missing_keys=True to load the rest")
        warnings.warn(message + "; they keep their current value", stacklevel=3)


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:_MAX_LISTED])
    more = f", ... ({len(names) - _MAX_LISTED} more)" if len(names) > _MAX_LISTED else ""
    return f"{len(names)} tensor{'s' if len(names) != 1 else ''} ({shown}{more})"


def _alias_groups(state: Mapping[str, torch.Tensor]) -> dict[str, list[str]]:
    # Tied weights are one tensor object under several names, on meta as on any device.
    by_id: dict[int, list[str]] = {}
    for name, tensor in state.items():
        by_id.setdefault(id(tensor), []).append(name)
    return {name: by_id[id(tensor)] for name, tensor in state.items()}


# --- devices and dtypes -----------------------------------------------------------------------


def _normalise_device_map(device_map: DeviceMap | None) -> dict[str, torch.device | str] | None:
    if device_map is None:
        return None
    from x_bigmodel.device_map import _device_key

    result: dict[str, torch.device | str] = {}
    for key, value in device_map.items():
        try:
            canonical = _device_key(value)
        except ValueError as exc:
            raise ValueError(f"device_map[{key!r}]: {exc}") from None
        result[key] = "disk" if canonical == "disk" else _as_device(canonical)
    return result


def _device_for(name: str, devices: dict[str, torch.device | str] | None, current: torch.Tensor) -> torch.device | str:
    if devices is None:
        return torch.device("cpu") if current.device.type == "meta" else current.device
    prefix = name
    while True:
        if prefix in devices:
            return devices[prefix]
        if not prefix:
            raise ValueError(f"{name} has no device in device_map (no entry for it or any module containing it)")
        prefix = prefix.rpartition(".")[0]


def _planned_dtype(
    name: str,
    current: torch.Tensor,
    entry: tuple[Path, str, tuple[int, ...], str],
    dtype: torch.dtype | None,
    fp32_modules: list[tuple[str, ...]],
) -> torch.dtype:
    # The dtype a disk tensor must have once read, worked out from the header alone.
    file_dtype = getattr(torch, entry[3], None)
    probe = torch.empty(0, dtype=file_dtype if isinstance(file_dtype, torch.dtype) else current.dtype)
    return _target_dtype(probe, current, dtype, name, fp32_modules)


# --- module surgery ---------------------------------------------------------------------------


# --- disk offload and progress ----------------------------------------------------------------


def _progress(files: list[Path], show_progress: bool) -> Iterable[Path]:
    if not show_progress:
        return files
    from x_common.process_env import process_env

    if process_env().rank != 0:
        return files
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return files
    return tqdm(files, desc="Loading checkpoint shards", unit="file")
