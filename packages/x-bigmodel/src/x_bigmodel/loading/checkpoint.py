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
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from x_bigmodel.devices.device_keys import storage_device
from x_bigmodel.devices.tensor_placement import (
    assign_aliases,
    owner_of,
    set_module_tensor_to_device,
    torch_dtype,
    wrap_like,
)
from x_bigmodel.files.checkpoint_files import (
    SAFETENSORS_SUFFIX,
    CheckpointReader,
    open_checkpoint,
    resolve_checkpoint_files,
)
from x_bigmodel.files.device_staging import DeviceStaging
from x_bigmodel.loading.load_plan import LoadPlan, PlannedTensor, alias_groups, check_keys, plan_load, planned_dtype
from x_bigmodel.loading.progress import ByteProgress, byte_progress
from x_bigmodel.loading.readahead import ByteRange, start_readahead
from x_bigmodel.offload.weights import write_offload_files, write_offload_index
from x_bigmodel.planning.device_plan import DeviceMap, DevicePlan

__all__ = [
    "DeviceMap",
    "OffloadIndex",
    "load_checkpoint_in_model",
    "load_planned",
    "resolve_checkpoint_files",
    "set_module_tensor_to_device",
]

# {param_name: {"safetensors_file": path, "key": name_in_file, "dtype": "float16", "shape": [..]}}
OffloadIndex = dict[str, dict[str, Any]]


def load_checkpoint_in_model(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: DeviceMap | DevicePlan | None = None,
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
            ``"disk"``), or a ``DevicePlan``; the longest prefix of a tensor's name wins, ``""``
            matches everything. Default: each tensor stays on its current device (CPU for meta
            tensors).
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
        show_progress: a progress bar of the bytes read (with rate and time left) on stderr,
            shown on the main process when stderr is a terminal and the load reads at least
            ``x_bigmodel.loading.progress.PROGRESS_MIN_BYTES`` (1 GiB); ``False`` never shows it
            (nor does ``TQDM_DISABLE=1``).
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
    plan = None if device_map is None else DevicePlan.from_map(device_map, offload_folder)
    return load_planned(
        model,
        files,
        plan,
        dtype=target_dtype,
        offload_buffers=offload_buffers,
        keep_in_fp32_modules=keep_in_fp32_modules,
        strict=strict,
        allow_missing_keys=allow_missing_keys,
        show_progress=show_progress,
        mmap=mmap,
    )


def load_planned(
    model: nn.Module,
    files: Mapping[Path, list[str] | None],
    plan: DevicePlan | None,
    *,
    dtype: torch.dtype | None = None,
    offload_buffers: bool = False,
    keep_in_fp32_modules: Iterable[str] | None = None,
    strict: bool = False,
    allow_missing_keys: bool = False,
    show_progress: bool = True,
    mmap: bool = True,
    names: Mapping[str, str] | None = None,
    populate: bool = True,
    read_ahead: bool = False,
) -> OffloadIndex:
    """``load_checkpoint_in_model`` once its arguments are resolved: ``files`` from
    ``resolve_checkpoint_files``, ``plan`` (``None``: tensors stay where they are) with the offload
    folder, ``dtype`` a ``torch.dtype``. The plan is read as is, not resolved again. ``names``
    maps checkpoint keys to model names where they differ (see ``plan_load``). ``populate=False``
    leaves the pages of mapped tensors to be faulted in by their first use (transformers' own
    loader does the same), instead of during the call; with it, ``read_ahead=True`` has a daemon
    thread read those pages into the page cache after the call, in the model's tensor order
    (``x_bigmodel.loading.readahead``): the first forward then waits less for a cold disk, and RSS does not grow.
    """
    if plan is not None:
        plan.check_present()
    fp32_modules = [tuple(m.split(".")) for m in keep_in_fp32_modules or ()]
    expected = model.state_dict(keep_vars=True)
    aliases = alias_groups(expected)
    buffer_names = {name for name, _ in model.named_buffers(remove_duplicate=False)}

    load_plan = plan_load(files, expected, plan, names)
    check_keys(model, expected, aliases, load_plan, strict, allow_missing_keys)
    offload_folder = plan.offload_folder if plan is not None else None

    if plan is not None and offload_folder is None:
        for name, planned in load_plan.tensors.items():
            if (
                plan.device_for(name) == "disk"
                and not planned.file.name.endswith(SAFETENSORS_SUFFIX)
                and (offload_buffers or name not in buffer_names)
            ):
                raise ValueError(
                    f"{name} is mapped to 'disk' but comes from a torch file, which cannot be read in place: "
                    "pass offload_folder= to save it there as safetensors"
                )

    offload_index: OffloadIndex = {}
    by_file = load_plan.by_file()
    # Decided for every file first: the progress bar needs the bytes to read before the first read.
    to_load: dict[Path, list[tuple[str, torch.device]]] = {}
    dtypes: dict[str, torch.dtype] = {}
    for path, names_in_file in by_file.items():
        to_load[path] = []
        for name in names_in_file:
            device = _target(name, plan, expected[name])
            planned = load_plan.tensors[name]
            tensor_dtype = dtypes[name] = planned_dtype(name, expected[name], planned, dtype, fp32_modules)
            if device == "disk" and (offload_buffers or name not in buffer_names):
                offload_index[name] = {"dtype": str(tensor_dtype).removeprefix("torch."), "shape": list(planned.shape)}
                if path.name.endswith(SAFETENSORS_SUFFIX):
                    offload_index[name].update(safetensors_file=str(path.resolve()), key=planned.key)
                continue
            to_load[path].append((name, torch.device("cpu") if device == "disk" else device))
    total = sum(
        load_plan.tensors[name].nbytes
        for loading in to_load.values()
        for name, device in loading
        if populate or not (mmap and _in_place(load_plan.tensors[name], device, dtypes[name]))
    )
    unread: list[tuple[str, ByteRange]] = []  # mapped tensors whose pages the call did not fault in
    with byte_progress(total, show_progress) as advance, DeviceStaging() as staging:
        for path, loading in to_load.items():
            with open_checkpoint(path) as reader:
                unread += _load_file(
                    model,
                    reader,
                    loading,
                    load_plan,
                    aliases,
                    expected,
                    dtype,
                    fp32_modules,
                    mmap,
                    populate,
                    advance,
                    staging,
                )
                unsaved = [
                    n for n in by_file[path] if n in offload_index and "safetensors_file" not in offload_index[n]
                ]
                if unsaved:
                    # A torch file cannot be read in place: its disk tensors go to one safetensors file.
                    assert offload_folder is not None  # checked before loading
                    saved = write_offload_files(
                        {n: reader.get(load_plan.tensors[n].key) for n in unsaved}, offload_folder, path.stem
                    )
                    for name in unsaved:
                        offload_index[name].update(
                            safetensors_file=saved[name]["safetensors_file"], key=saved[name]["key"]
                        )
    if offload_folder is not None and offload_index:
        write_offload_index(Path(offload_folder), offload_index)
    if read_ahead and unread:
        order = {name: i for i, name in enumerate(expected)}  # registration order: a forward's order
        ahead = [(name, item) for name, item in unread if not _looked_up(model, aliases[name])]
        start_readahead([item for _, item in sorted(ahead, key=lambda pair: order[pair[0]])], owner=model)
    return offload_index


def _target(name: str, plan: DevicePlan | None, current: torch.Tensor) -> torch.device | Literal["disk"]:
    """Where ``name`` is loaded: ``"disk"``, or a device; without a plan, where it is now (CPU for meta)."""
    if plan is None:
        return torch.device("cpu") if current.device.type == "meta" else current.device
    key = plan.device_for(name)
    return "disk" if key == "disk" else storage_device(key)


def _looked_up(model: nn.Module, names: list[str]) -> bool:
    """Whether the tensor is only an embedding table: a forward reads the rows of the ids it is
    given, so reading it whole ahead of time (a 32000-row vocabulary: 250 MiB for a 2 GB model)
    would take disk time and page cache from the weights a forward reads whole. Tied to an output
    head (GPT-2), it is read whole."""
    return len(names) == 1 and isinstance(owner_of(model, names[0])[0], nn.Embedding)


def _in_place(planned: PlannedTensor, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the tensor is used as the file's mapped pages (``CheckpointReader.can_map``, from the header)."""
    return (
        planned.file.name.endswith(SAFETENSORS_SUFFIX)
        and device.type == "cpu"
        and planned.file_dtype == str(dtype).removeprefix("torch.")
    )


def _load_file(
    model: nn.Module,
    reader: CheckpointReader,
    loading: list[tuple[str, torch.device]],
    load_plan: LoadPlan,
    aliases: Mapping[str, list[str]],
    expected: Mapping[str, torch.Tensor],
    dtype: torch.dtype | None,
    fp32_modules: list[tuple[str, ...]],
    mmap: bool,
    populate: bool,
    advance: ByteProgress,
    staging: DeviceStaging,
) -> list[tuple[str, ByteRange]]:
    """Read ``loading`` (names and devices) from the open ``reader`` into ``model``, in file order.

    Returns the tensors used as the file's mapped pages and not faulted in (``populate=False``),
    by name, with their bytes in the file.
    """
    # In file order: the reads then go through the file front to back.
    ordered = sorted(loading, key=lambda item: reader.offset(load_plan.tensors[item[0]].key))
    planned_list = [load_plan.tensors[n] for n, _ in ordered]
    dtypes = [
        planned_dtype(n, expected[n], p, dtype, fp32_modules) for (n, _), p in zip(ordered, planned_list, strict=True)
    ]
    mapped = {p.key for (_, d), p, t in zip(ordered, planned_list, dtypes, strict=True) if mmap and _in_place(p, d, t)}
    if populate:  # mapped tensors are read here, as their pages are faulted in; the others as each is loaded
        reader.map_in(sorted(mapped), advance)
    unread = []
    for (name, device), planned, tensor_dtype in zip(ordered, planned_list, dtypes, strict=True):
        new = reader.load(planned.key, device, tensor_dtype, mapped=mmap, staging=staging)
        if planned.key not in mapped:
            advance(planned.nbytes)
        elif not populate:
            unread.append((name, ByteRange(reader.path, reader.offset(planned.key), reader.nbytes(planned.key))))
        assign_aliases(model, aliases[name], wrap_like(expected[name], new))
    return unread
