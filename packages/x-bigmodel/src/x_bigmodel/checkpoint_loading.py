"""Stream a checkpoint into a (possibly meta-device) model, one tensor at a time.

The loader never builds the checkpoint's state dict: each safetensors file is opened by memory
map, each tensor is read, converted and copied straight to the device the ``device_map`` names,
and the mapped pages are handed back to the kernel before the next tensor is read. Peak memory is
therefore the model plus one tensor, not the model plus a shard (or the whole state dict).

Where we differ from Accelerate's ``load_checkpoint_in_model``:

* keys, shapes and devices are checked for the whole checkpoint (from the file headers) before any
  tensor is loaded, so a bad checkpoint fails fast and leaves the model untouched;
* missing keys are an error unless ``allow_missing_keys=True`` (Accelerate loads silently);
* tensors mapped to ``"disk"`` that already live in a safetensors file are not copied: the
  returned offload index points at the file and key, to be read in place by memory map;
* ``.bin``/``.pt`` files are read only with ``torch.load(weights_only=True, mmap=True)``.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import sys
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

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

_SAFETENSORS_SUFFIX = ".safetensors"
_TORCH_SUFFIXES = (".bin", ".pt", ".pth")
_MAX_LISTED = 10


def set_module_tensor_to_device(
    module: nn.Module,
    tensor_name: str,
    device: int | str | torch.device,
    value: torch.Tensor | None = None,
    dtype: str | torch.dtype | None = None,
) -> None:
    """Put parameter or buffer ``tensor_name`` of ``module`` on ``device``, optionally with a new value.

    The slot is replaced (not copied into), so this works on meta tensors. A parameter stays an
    instance of its class with its ``requires_grad``. Only the named slot changes: for tied weights,
    assign every alias (``load_checkpoint_in_model`` does).

    Args:
        module: the root module.
        tensor_name: dotted name, as in ``module.state_dict()``, e.g. ``"layers.0.weight"``.
        device: target device (``"cpu"``, ``"cuda:0"``, an int GPU id, ``torch.device``).
        value: the new value; its shape must match the current tensor's. Without it the current
            tensor moves, which a meta tensor cannot.
        dtype: cast floating values to this dtype. Default: a floating value takes the current
            tensor's dtype when that is floating; integer and bool values keep theirs.

    Raises:
        AttributeError: the module has no such parameter or buffer.
        ValueError: the shapes differ, or a meta tensor would be moved without a value.

    Examples:
        >>> with torch.device("meta"):
        ...     layer = nn.Linear(2, 3)
        >>> set_module_tensor_to_device(layer, "weight", "cpu", value=torch.ones(3, 2))
        >>> layer.weight.device.type, type(layer.weight).__name__, layer.weight.requires_grad
        ('cpu', 'Parameter', True)
    """
    owner, leaf = _owner(module, tensor_name)
    old = _current(owner, leaf, tensor_name)
    target_device = _as_device(device)
    if value is None:
        if old.device.type == "meta" and target_device.type != "meta":
            raise ValueError(f"{tensor_name} is on the meta device and has no data: pass value= to materialise it")
        value = old.detach()
    elif tuple(value.shape) != tuple(old.shape):
        raise ValueError(
            f"shape mismatch for {tensor_name}: the checkpoint has {tuple(value.shape)}, "
            f"the model expects {tuple(old.shape)}"
        )
    target_dtype = _target_dtype(value, old, torch_dtype(dtype) if dtype is not None else None)
    new = value.detach().to(device=target_device, dtype=target_dtype)
    _assign(owner, leaf, _wrap_like(old, new))


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``torch.float16`` from ``"float16"``, ``"torch.float16"``, ``"fp16"`` or ``torch.float16``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    from x_common.dtypes import dtype_name

    result = getattr(torch, dtype_name(dtype), None)
    if not isinstance(result, torch.dtype):
        raise ValueError(f"{dtype!r} is not a torch dtype")
    return result


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
    if not path.name.endswith((_SAFETENSORS_SUFFIX, *_TORCH_SUFFIXES)):
        raise ValueError(f"checkpoint {str(path)!r} is not a .safetensors, .bin, .pt or .index.json file")
    return {path: None}


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
                _save_offloaded(None, name, None)  # raises: a torch file cannot be read in place

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
            for name, device in to_load:
                value = reader.get(plan[name][1])
                new = _convert(value, device, _target_dtype(value, expected[name], target_dtype, name, fp32_modules))
                if reader.mmapped:
                    _release_pages(value, new)
                del value
                _assign_all(model, aliases[name], _wrap_like(expected[name], new))
            for name in names:
                if name in offload_index and "safetensors_file" not in offload_index[name]:
                    offload_index[name].update(_save_offloaded(reader.get(plan[name][1]), name, offload_folder))
    if offload_folder is not None and offload_index:
        _write_offload_index(Path(offload_folder), offload_index)
    return offload_index


# --- checkpoint discovery ---------------------------------------------------------------------


def _pick_in_folder(folder: Path) -> Path:
    indexes = sorted(folder.glob("*.index.json"))
    safe_indexes = [p for p in indexes if p.name.endswith(".safetensors.index.json")]
    candidates = safe_indexes or indexes
    if len(candidates) > 1:
        names = ", ".join(p.name for p in candidates)
        raise ValueError(f"checkpoint folder {str(folder)!r} holds several index files ({names}); pass one of them")
    if candidates:
        return candidates[0]
    for pattern in ("*.safetensors", *(f"*{s}" for s in _TORCH_SUFFIXES)):
        found = sorted(folder.glob(pattern))
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


# --- reading files ----------------------------------------------------------------------------


class _Reader:
    """One open checkpoint file; ``get`` returns one tensor, by memory map."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.mmapped = path.name.endswith(_SAFETENSORS_SUFFIX)
        self._handle: Any = None
        self._state: dict[str, Any] | None = None

    def __enter__(self) -> _Reader:
        if self.mmapped:
            from safetensors import safe_open

            try:
                self._handle = safe_open(str(self.path), framework="pt", device="cpu")
                self._handle.__enter__()
            except Exception as exc:
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
        if self._handle is not None:
            self._handle.__exit__(*exc_info)
        self._handle = self._state = None

    def keys(self) -> list[str]:
        return list(self._handle.keys()) if self._handle is not None else list(self._state or {})

    def shape(self, key: str) -> tuple[int, ...]:
        if self._handle is not None:
            return tuple(self._handle.get_slice(key).get_shape())
        return tuple(self._state[key].shape)  # type: ignore[index]

    def dtype(self, key: str) -> str:
        if self._handle is not None:
            return _SAFETENSORS_DTYPES.get(self._handle.get_slice(key).get_dtype(), "unknown")
        return str(self._state[key].dtype).removeprefix("torch.")  # type: ignore[index]

    def get(self, key: str) -> torch.Tensor:
        if self._handle is None:
            return self._state[key]  # type: ignore[index]
        try:
            return self._handle.get_tensor(key)
        except Exception as exc:
            raise _unreadable(self.path, exc) from exc


_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
}


def _open(path: Path) -> _Reader:
    return _Reader(path)


def _unreadable(path: Path, exc: BaseException) -> ValueError:
    if path.name.endswith(_SAFETENSORS_SUFFIX):
        hint = "the file is corrupt or truncated (an interrupted download or save?); download or save it again"
    else:
        hint = (
            "it is corrupt, truncated, or holds more than tensors (torch.load with weights_only=True "
            "refuses arbitrary pickled objects); convert it to safetensors"
        )
    return ValueError(f"cannot read checkpoint file {str(path)!r}: {exc}; {hint}")


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


def _as_device(device: int | str | torch.device) -> torch.device:
    if isinstance(device, int):
        return torch.device(torch.accelerator.current_accelerator() or "cuda", device)  # type: ignore[arg-type]
    return torch.device(device)


def _normalise_device_map(device_map: DeviceMap | None) -> dict[str, torch.device | str] | None:
    if device_map is None:
        return None
    return {k: ("disk" if v == "disk" else _as_device(v)) for k, v in device_map.items()}


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


def _in_fp32_module(name: str, fp32_modules: list[tuple[str, ...]]) -> bool:
    parts = tuple(name.split("."))
    return any(parts[i : i + len(m)] == m for m in fp32_modules for i in range(len(parts) - len(m) + 1))


def _target_dtype(
    value: torch.Tensor,
    current: torch.Tensor,
    dtype: torch.dtype | None,
    name: str = "",
    fp32_modules: list[tuple[str, ...]] | None = None,
) -> torch.dtype:
    if not value.is_floating_point():
        return value.dtype
    if fp32_modules and _in_fp32_module(name, fp32_modules):
        return torch.float32
    if dtype is not None:
        return dtype
    return current.dtype if current.is_floating_point() else value.dtype


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


def _convert(value: torch.Tensor, device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    # copy=True: the model must own its memory, not keep the file's mapped pages (see _release_pages).
    return value.to(device=device, dtype=dtype, copy=True)


def _release_pages(source: torch.Tensor, copy: torch.Tensor) -> None:
    """Drop the file pages behind ``source`` from this process once they are copied.

    While a safetensors file is open, every page read stays mapped (and counted in RSS), so
    loading a 5 GB shard costs 5 GB beside the model. Advising the kernel that the pages are no
    longer needed keeps the peak at the model plus one tensor. The pages are clean (read-only
    use), so the kernel re-reads them from the file should anything touch them again.
    """
    if not sys.platform.startswith("linux") or source.device.type != "cpu" or source.numel() == 0:
        return
    if copy.device.type == "cpu" and copy.untyped_storage().data_ptr() == source.untyped_storage().data_ptr():
        return  # never advise away memory the model now uses
    libc = _libc()
    if libc is None:
        return
    start = source.data_ptr()
    aligned = start - start % mmap.PAGESIZE
    libc.madvise(ctypes.c_void_p(aligned), ctypes.c_size_t(start + source.nbytes - aligned), mmap.MADV_DONTNEED)


_LIBC: list[Any] = []


def _libc() -> Any:
    if not _LIBC:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            _LIBC.append(libc)
        except (OSError, AttributeError):
            _LIBC.append(None)
    return _LIBC[0]


# --- module surgery ---------------------------------------------------------------------------


def _owner(module: nn.Module, tensor_name: str) -> tuple[nn.Module, str]:
    prefix, _, leaf = tensor_name.rpartition(".")
    try:
        return (module.get_submodule(prefix) if prefix else module), leaf
    except AttributeError as exc:
        raise AttributeError(f"{type(module).__name__} has no module {prefix!r} (for {tensor_name})") from exc


def _current(owner: nn.Module, leaf: str, tensor_name: str) -> torch.Tensor:
    if leaf in owner._parameters and owner._parameters[leaf] is not None:
        return owner._parameters[leaf]  # type: ignore[return-value]
    if leaf in owner._buffers and owner._buffers[leaf] is not None:
        return owner._buffers[leaf]  # type: ignore[return-value]
    raise AttributeError(f"{type(owner).__name__} has no parameter or buffer {leaf!r} (for {tensor_name})")


def _wrap_like(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    if not isinstance(old, nn.Parameter):
        return new
    grad = old.requires_grad and (new.is_floating_point() or new.is_complex())
    param = type(old)(new, requires_grad=grad)
    # Keep attributes callers hang on parameters (e.g. sharding or init markers).
    for key, value in vars(old).items():
        if key not in vars(param):
            setattr(param, key, value)
    return param


def _assign(owner: nn.Module, leaf: str, new: torch.Tensor) -> None:
    if leaf in owner._parameters:
        owner._parameters[leaf] = new  # type: ignore[assignment]
    else:
        owner._buffers[leaf] = new


def _assign_all(model: nn.Module, names: list[str], new: torch.Tensor) -> None:
    for name in names:
        owner, leaf = _owner(model, name)
        _assign(owner, leaf, new)


# --- disk offload and progress ----------------------------------------------------------------


def _save_offloaded(
    value: torch.Tensor | None, name: str, offload_folder: str | os.PathLike[str] | None
) -> dict[str, str]:
    # Only tensors from torch files get here: safetensors ones are read in place.
    if offload_folder is None:
        raise ValueError(
            f"{name} is mapped to 'disk' but comes from a torch file, which cannot be read in place: "
            "pass offload_folder= to save it there as safetensors"
        )
    from safetensors.torch import save_file

    assert value is not None
    folder = Path(offload_folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.safetensors"
    save_file({name: value.contiguous()}, str(path))
    return {"safetensors_file": str(path.resolve()), "key": name}


def _write_offload_index(folder: Path, offload_index: OffloadIndex) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "index.json"
    merged = json.loads(path.read_text()) if path.is_file() else {}
    merged.update(offload_index)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(merged, indent=2, sort_keys=True))
    os.replace(tmp, path)


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
