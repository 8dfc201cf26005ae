"""Run a model spread over devices: ``dispatch_model``, ``load_checkpoint_and_dispatch``,
``cpu_offload`` and ``disk_offload``, with Accelerate's names and arguments.

Each device-map entry gets a hook that moves its inputs to its execution device (its own device,
or the main device for ``"cpu"``/``"disk"`` entries). Weights of an entry whose device is not
where it runs — on disk, or in RAM while the forward runs on a GPU — are *offloaded*: between
forwards the parameters are meta tensors, and the hook brings the weights in before the forward
and releases them after, the next block's being fetched on a background thread meanwhile.

An offloaded entry larger than one unit (the whole model, or a module holding several blocks of the
``no_split_module_classes``) is cut into units, each with its own hook, so a forward holds one unit
at a time, never the whole entry. Disk weights already in a safetensors checkpoint are read from
it in place; nothing is copied to the offload folder for them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from x_bigmodel.align_hook import AlignDevicesHook
from x_bigmodel.checkpoint_loading import load_checkpoint_in_model
from x_bigmodel.device_map import _units, resolve_device_map
from x_bigmodel.hooks import add_hook_to_module, remove_hook_from_module
from x_bigmodel.offload_weights import (
    FileWeight,
    MemoryWeight,
    read_offload_index,
    sources_from_index,
    write_offload_files,
)
from x_bigmodel.offloaded_block import OffloadedBlock, WeightGroup
from x_bigmodel.prefetch import Prefetcher
from x_bigmodel.tensor_placement import _as_device, _assign, _owner, _wrap_like

__all__ = ["cpu_offload", "disk_offload", "dispatch_model", "load_checkpoint_and_dispatch"]

_OFFLOAD_TARGETS = ("cpu", "disk")


def dispatch_model(
    model: nn.Module,
    device_map: Mapping[str, Any],
    main_device: int | str | torch.device | None = None,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    offload_dir: str | os.PathLike[str] | None = None,
    offload_index: Mapping[str, Mapping[str, Any]] | None = None,
    offload_buffers: bool = False,
    skip_keys: str | Iterable[str] | None = None,
    preload_module_classes: Iterable[str] | None = None,
    force_hooks: bool = False,
    output_device: int | str | torch.device | None = None,
    prefetch: bool = True,
) -> nn.Module:
    """Place ``model`` as ``device_map`` says and hook it so that its forward runs across devices.

    Args:
        model: a model whose tensors are loaded (on any device) or, for entries offloaded to disk,
            on the meta device with their place given by ``offload_index``/``offload_dir``.
        device_map: ``{module or tensor name: device}`` (see ``resolve_device_map``).
        main_device: where ``"cpu"`` and ``"disk"`` entries run. Default: the first accelerator in
            the map, else the CPU.
        state_dict: values for offloaded tensors (instead of the model's own).
        offload_dir: folder with the offload ``index.json``; disk-mapped tensors that are in memory
            and not indexed are saved there (as safetensors) before being dropped from memory.
        offload_index: the index ``load_checkpoint_in_model`` returned (wins over ``offload_dir``'s).
        offload_buffers: offload buffers of offloaded entries too; by default they stay on the
            execution device.
        skip_keys: keyword arguments never moved between devices (default: the model's
            ``_skip_keys_device_placement``, e.g. transformers' KV cache).
        preload_module_classes: classes of modules whose whole subtree is loaded in their own
            forward (modules that use their children's weights without calling them).
        force_hooks: hook the model even when it all sits on one device.
        output_device: where outputs are returned. Default: the main device.
        prefetch: fetch the next offloaded block's weights on a background thread.

    Returns:
        ``model``, with ``model.hf_device_map`` set.

    Raises:
        ValueError: an invalid device map, or an offloaded tensor with no value anywhere (on meta,
            not in the offload index nor in ``state_dict``), naming it.
    """
    device_map = resolve_device_map(model, device_map)
    remove_hook_from_module(model, recurse=True)
    values = list(device_map.values())
    main = _as_device(main_device) if main_device is not None else _main_device(values)
    output = _as_device(output_device) if output_device is not None else main
    model.hf_device_map = dict(device_map)  # type: ignore[assignment]
    only = set(values)
    if not force_hooks and len(only) == 1 and "disk" not in only and _run_device(values[0], main) == _place(values[0]):
        model.to(_place(values[0]))
        return model

    if skip_keys is None:
        skip_keys = getattr(model, "_skip_keys_device_placement", None) or ()
    skip = (skip_keys,) if isinstance(skip_keys, str) else tuple(skip_keys)
    index = {**(read_offload_index(offload_dir) if offload_dir is not None else {}), **(offload_index or {})}
    unit_classes = set(getattr(model, "_no_split_modules", None) or ()) | set(preload_module_classes or ())

    entries = _assign_entries(model, device_map)
    units = _UnitFinder(model, unit_classes)
    blocks_by_module: dict[str, list[WeightGroup]] = {}
    to_save: dict[str, dict[str, torch.Tensor]] = {}
    resident: list[tuple[list[str], torch.device]] = []
    persistent = set(model.state_dict(keep_vars=True))
    kept_buffers: dict[str, dict[str, torch.Tensor]] = {}
    for names, tensor, is_buffer in _alias_groups(model):
        entry = entries[names[0]]
        device = device_map[entry]
        run = _run_device(device, main)
        offloaded = device == "disk" or (device == "cpu" and run.type != "cpu")
        unsaved = tensor.device.type != "meta" and device == "disk" and not any(n in index for n in names)
        # Buffers stay on the execution device unless asked; non-persistent ones always (they are
        # in no checkpoint, so there is nothing to read them back from).
        if not offloaded or (is_buffer and (not offload_buffers or names[0] not in persistent)):
            if unsaved and names[0] in persistent:
                kept_buffers.setdefault(entry or "model", {}).update(dict.fromkeys(names, tensor))
            resident.append((names, run if device in _OFFLOAD_TARGETS else _place(device)))
            continue
        if unsaved:
            to_save.setdefault(entry or "model", {}).update(dict.fromkeys(names, tensor))
        # A tensor tied across units (embedding and LM head) is brought in by each unit that uses it.
        by_unit: dict[str, list[str]] = {}
        for name in names:
            by_unit.setdefault(units.unit_for(entries[name], name), []).append(name)
        for unit, unit_names in by_unit.items():
            slots = [_owner(model, n) for n in unit_names]
            group = WeightGroup(names, slots, tensor, None)  # type: ignore[arg-type]
            group.original_device = None if tensor.device.type == "meta" else tensor.device
            blocks_by_module.setdefault(unit, []).append(group)

    if to_save:
        # Weights are being saved: save the buffers kept in memory too, so the folder holds the model.
        for stem, tensors in kept_buffers.items():
            to_save.setdefault(stem, {}).update(tensors)
        if offload_dir is None:
            first = next(iter(next(iter(to_save.values()))))
            raise ValueError(
                f"{first} is mapped to 'disk' and held in memory, with no offload index saying where it is "
                "on disk: pass offload_dir= to have it saved there"
            )
        for stem, tensors in to_save.items():
            index.update(write_offload_files(tensors, offload_dir, stem))
    file_sources = sources_from_index(
        {n: index[n] for gs in blocks_by_module.values() for g in gs for n in g.names if n in index}, offload_dir
    )

    # One open per file for every resident tensor listed in the index, not one per tensor.
    resident_sources = sources_from_index(
        {n: index[n] for names, _ in resident for n in names if n in index}, offload_dir
    )
    for names, target in resident:
        _materialise(model, names, target, resident_sources, state_dict)
    blocks: list[OffloadedBlock] = []
    for unit, unit_groups in blocks_by_module.items():
        for group in unit_groups:
            group.source = _source_for(group, file_sources, state_dict)
            dtype = group.source.dtype if isinstance(group.source, FileWeight) else group.source.tensor.dtype
            group.template = _meta_like(group.template, dtype)
            for owner, leaf in group.slots:
                _assign(owner, leaf, group.template)
        blocks.append(
            OffloadedBlock(unit, unit_groups, _run_device(device_map[entries[unit_groups[0].names[0]]], main))
        )

    _attach_hooks(model, device_map, main, output, blocks, skip, prefetch)
    return model


def _attach_hooks(
    model: nn.Module,
    device_map: Mapping[str, Any],
    main: torch.device,
    output: torch.device,
    blocks: list[OffloadedBlock],
    skip: tuple[str, ...],
    prefetch: bool,
) -> None:
    prefetcher = Prefetcher(blocks, enabled=prefetch) if blocks else None
    run_devices = {_run_device(device, main) for device in device_map.values()}
    hooks: dict[str, AlignDevicesHook] = {}
    if len(run_devices) > 1:
        # Inputs cross devices between entries: each entry moves its inputs to where it runs.
        for entry, device in device_map.items():
            for name in _called_modules(model, entry):
                hooks[name] = AlignDevicesHook(_run_device(device, main), skip_keys=skip)
    for block in blocks:
        hook = hooks.setdefault(block.name, AlignDevicesHook(block.device, skip_keys=skip))
        hook.execution_device = block.device
        hook.block, hook.prefetcher = block, prefetcher
    root = hooks.setdefault("", AlignDevicesHook(None, skip_keys=skip))
    if len(run_devices) == 1:
        root.execution_device = next(iter(run_devices))
    root.output_device = output
    root.prefetcher, root.owns_prefetcher = root.prefetcher or prefetcher, True
    root.tracked = list(hooks.values())
    for name, hook in hooks.items():
        add_hook_to_module(model.get_submodule(name), hook)


def _called_modules(model: nn.Module, entry: str) -> list[str]:
    """The modules whose calls run entry ``entry``: the entry itself, but a ``ModuleList`` or
    ``ModuleDict`` is never called, so its children stand in for it; a tensor entry, its module."""
    if not _is_module(model, entry):
        return [entry.rpartition(".")[0]]
    module = model.get_submodule(entry)
    if not isinstance(module, (nn.ModuleList, nn.ModuleDict)):
        return [entry]
    prefix = f"{entry}." if entry else ""
    return [n for child, _ in module.named_children() for n in _called_modules(model, prefix + child)]


def load_checkpoint_and_dispatch(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: Mapping[str, Any] | str | None = None,
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: Iterable[str] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    offload_buffers: bool = False,
    dtype: str | torch.dtype | None = None,
    offload_state_dict: bool | None = None,
    skip_keys: str | Iterable[str] | None = None,
    preload_module_classes: Iterable[str] | None = None,
    force_hooks: bool = False,
    strict: bool = False,
    show_progress: bool = True,
    prefetch: bool = True,
    output_device: int | str | torch.device | None = None,
    allow_missing_keys: bool = False,
    mmap: bool = True,
) -> nn.Module:
    """Load ``checkpoint`` into ``model`` (usually built under ``init_empty_weights``) and dispatch it.

    ``device_map`` is a dict or ``"auto"``/``"balanced"``/``"balanced_low_0"``/``"sequential"``
    (planned within ``max_memory``, keeping ``no_split_module_classes`` whole; default: the
    model's ``_no_split_modules``). Without a device map the checkpoint is loaded where the
    model's tensors are (CPU for meta ones) and the model is returned without hooks.

    Disk-mapped weights are read from a safetensors checkpoint in place; ``offload_folder`` is
    needed only for ``.bin`` checkpoints (their disk weights are saved there as safetensors).
    See ``load_checkpoint_in_model`` and ``dispatch_model`` for the other arguments.

    Examples:
        >>> import tempfile
        >>> from safetensors.torch import save_file
        >>> from x_bigmodel import init_empty_weights
        >>> folder = tempfile.mkdtemp()
        >>> save_file({"0.weight": torch.eye(2), "0.bias": torch.ones(2)}, f"{folder}/model.safetensors")
        >>> with init_empty_weights():
        ...     model = nn.Sequential(nn.Linear(2, 2))
        >>> model = load_checkpoint_and_dispatch(model, folder, device_map={"": "disk"}, show_progress=False)
        >>> model(torch.tensor([[1.0, 2.0]])).tolist(), model[0].weight.device.type
        ([[2.0, 3.0]], 'meta')
    """
    del offload_state_dict  # nothing to offload: the loader never builds the state dict
    if no_split_module_classes is None:
        no_split_module_classes = getattr(model, "_no_split_modules", None)
    if device_map is not None:
        # Planned or checked before anything is read or written: a bad map changes nothing.
        device_map = resolve_device_map(
            model,
            device_map,
            max_memory=max_memory,
            no_split_module_classes=no_split_module_classes,
            dtype=dtype,
            offload_buffers=offload_buffers,
        )
    index = load_checkpoint_in_model(
        model,
        checkpoint,
        device_map=device_map,
        offload_folder=offload_folder,
        dtype=dtype,
        offload_buffers=offload_buffers,
        strict=strict,
        allow_missing_keys=allow_missing_keys,
        show_progress=show_progress,
        mmap=mmap,
    )
    if device_map is None:
        return model
    return dispatch_model(
        model,
        device_map,
        offload_dir=offload_folder,
        offload_index=index,
        offload_buffers=offload_buffers,
        skip_keys=skip_keys,
        preload_module_classes=[*(preload_module_classes or ()), *(no_split_module_classes or ())],
        force_hooks=force_hooks,
        output_device=output_device,
        prefetch=prefetch,
    )


def cpu_offload(
    model: nn.Module,
    execution_device: int | str | torch.device | None = None,
    offload_buffers: bool = False,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    preload_module_classes: Iterable[str] | None = None,
    prefetch: bool = True,
) -> nn.Module:
    """Keep the whole model's weights in RAM and run each unit on ``execution_device``, bringing
    its weights there for its forward (the next unit's are copied meanwhile).

    ``execution_device`` defaults to the first accelerator here (CPU when there is none, which
    makes this a no-op beyond the hooks). Accelerate defaults to the device of the model's first
    parameter instead, which for a model on the CPU means offloading nothing.
    """
    return _offload_whole(
        model,
        "cpu",
        execution_device,
        preload_module_classes,
        state_dict=state_dict,
        offload_buffers=offload_buffers,
        prefetch=prefetch,
    )


def disk_offload(
    model: nn.Module,
    offload_dir: str | os.PathLike[str],
    execution_device: int | str | torch.device | None = None,
    offload_buffers: bool = False,
    preload_module_classes: Iterable[str] | None = None,
    prefetch: bool = True,
) -> nn.Module:
    """Keep the whole model's weights on disk, in ``offload_dir``, and run each unit on
    ``execution_device`` (default: the first accelerator here, else the CPU).

    When ``offload_dir`` holds an ``index.json`` it is taken to hold the model's weights (as
    Accelerate does); otherwise the weights are saved there as safetensors, then dropped from RAM.
    """
    return _offload_whole(
        model,
        "disk",
        execution_device,
        preload_module_classes,
        offload_dir=offload_dir,
        offload_buffers=offload_buffers,
        prefetch=prefetch,
    )


def _offload_whole(
    model: nn.Module,
    where: str,
    execution_device: int | str | torch.device | None,
    preload_module_classes: Iterable[str] | None,
    **options: Any,
) -> nn.Module:
    # Every unit (no-split/preload class module, leaf, or tensor of a split module) gets its own
    # entry, so a forward holds one unit's weights at a time.
    classes = set(getattr(model, "_no_split_modules", None) or ()) | set(preload_module_classes or ())
    device = _as_device(execution_device) if execution_device is not None else _default_accelerator()
    device_map = {unit.name: where for unit in _units(model, classes)}
    for name, _ in _named_tensors(model):  # a module registered under a second name (self.b = self.a)
        if not any(name == k or name.startswith(f"{k}.") or k == "" for k in device_map):
            device_map[name.rpartition(".")[0]] = where
    return dispatch_model(
        model,
        device_map,
        main_device=device,
        preload_module_classes=preload_module_classes,
        force_hooks=True,
        **options,
    )


# --- helpers ----------------------------------------------------------------------------------


def _place(device: Any) -> torch.device:
    return torch.device("cpu") if device in _OFFLOAD_TARGETS else _as_device(device)


def _run_device(device: Any, main: torch.device) -> torch.device:
    return main if device in _OFFLOAD_TARGETS else _as_device(device)


def _main_device(values: list[Any]) -> torch.device:
    for value in values:
        if value not in _OFFLOAD_TARGETS:
            return _as_device(value)
    return torch.device("cpu")


def _default_accelerator() -> torch.device:
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return torch.device(accelerator.type, 0) if accelerator is not None else torch.device("cpu")


def _is_module(model: nn.Module, name: str) -> bool:
    try:
        model.get_submodule(name)
    except AttributeError:
        return False
    return True


def _assign_entries(model: nn.Module, device_map: Mapping[str, Any]) -> dict[str, str]:
    """Each tensor name to the device-map entry that places it (the longest prefix)."""
    result: dict[str, str] = {}
    for name, _ in _named_tensors(model):
        prefix = name
        while prefix not in device_map:
            if not prefix:
                raise ValueError(f"{name} has no device in device_map")
            prefix = prefix.rpartition(".")[0]
        result[name] = prefix
    return result


def _named_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    # Every name of every tensor, non-persistent buffers included (they are not in state_dict).
    named = list(model.named_parameters(remove_duplicate=False))
    named += [(n, b) for n, b in model.named_buffers(remove_duplicate=False) if b is not None]
    return named


def _alias_groups(model: nn.Module) -> list[tuple[list[str], torch.Tensor, bool]]:
    buffers = {id(b) for _, b in model.named_buffers(remove_duplicate=False) if b is not None}
    by_id: dict[int, tuple[list[str], torch.Tensor, bool]] = {}
    for name, tensor in _named_tensors(model):
        by_id.setdefault(id(tensor), ([], tensor, id(tensor) in buffers))[0].append(name)
    return list(by_id.values())


class _UnitFinder:
    """Which module's hook brings in an offloaded tensor: going down from its device-map entry to
    the tensor's own module, the first module that is of a unit class (no-split or preload) or a
    leaf; else the tensor's own module (a tensor held directly by a split module).

    Containers are never units (a ``ModuleList`` is never called, so a hook on it would never run),
    and neither is a module of no unit class with children: its forward calls them, and each child
    brings in its own weights, one at a time.
    """

    def __init__(self, model: nn.Module, unit_classes: set[str]) -> None:
        self.model, self.unit_classes = model, unit_classes

    def unit_for(self, entry: str, name: str) -> str:
        owner = name.rpartition(".")[0]
        if not _is_module(self.model, entry):
            return owner  # the entry is a tensor: its module's hook brings it in
        prefix = entry
        path = owner[len(entry) :].lstrip(".").split(".") if owner != entry else []
        for part in [None, *path]:
            if part is not None:
                prefix = f"{prefix}.{part}" if prefix else part
            module = self.model.get_submodule(prefix)
            if type(module).__name__ in self.unit_classes or next(module.children(), None) is None:
                return prefix
        return owner


def _meta_like(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # Between forwards the slot shows the shape and dtype the forward will see, on meta.
    if tensor.device.type == "meta" and tensor.dtype == dtype:
        return tensor
    return _wrap_like(tensor, torch.empty(tensor.shape, dtype=dtype, device="meta"))


def _source_for(
    group: WeightGroup, file_sources: Mapping[str, FileWeight], state_dict: Mapping[str, torch.Tensor] | None
) -> MemoryWeight | FileWeight:
    for name in group.names:
        if state_dict is not None and name in state_dict:
            return MemoryWeight(state_dict[name].to(group.template.dtype))
    for name in group.names:
        if name in file_sources:
            return file_sources[name]
    if group.template.device.type != "meta":
        return MemoryWeight(group.template.detach().to("cpu"))
    raise ValueError(
        f"{group.names[0]} is offloaded but has no value: it is on the meta device and neither in the "
        "offload index nor in state_dict (was the checkpoint loaded with this device map?)"
    )


def _materialise(
    model: nn.Module,
    names: list[str],
    device: torch.device,
    sources: Mapping[str, FileWeight],
    state_dict: Mapping[str, torch.Tensor] | None,
) -> None:
    """Put a resident tensor (all its aliases) on ``device``.

    Its value comes from the offload index when listed there (a buffer of a disk module kept on
    the execution device: in a meta-built model it holds only its initial value), else from
    ``state_dict``, else from where it is now.
    """
    owner, leaf = _owner(model, names[0])
    current = getattr(owner, leaf)
    found = [n for n in names if n in sources]
    if found:
        source = sources[found[0]]
        value = source.file.read(source.key).to(device=device, dtype=source.dtype)
    elif state_dict is not None and names[0] in state_dict:
        value = state_dict[names[0]].to(device=device, dtype=current.dtype)
    elif current.device.type == "meta":
        raise ValueError(
            f"{names[0]} is on the meta device with no value to load: it is not in the checkpoint's "
            "offload index nor in state_dict"
        )
    elif current.device == device:
        return
    else:
        value = current.detach().to(device)
    live = _wrap_like(current, value)
    for name in names:
        _assign(*_owner(model, name), live)
