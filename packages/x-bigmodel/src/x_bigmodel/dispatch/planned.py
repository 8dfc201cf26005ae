"""``dispatch_planned``: place a model as a ``DevicePlan`` says and hook it to run across devices.

Each plan entry gets a hook that moves its inputs to its execution device (its own device, or the
main device for ``"cpu"``/``"disk"`` entries). Weights of an entry whose device is not where it
runs — on disk, or in RAM while the forward runs on a GPU — are *offloaded*: between forwards the
parameters are meta tensors, and the hook brings the weights in before the forward and releases
them after, the next block's being fetched on a background thread meanwhile.

An offloaded entry larger than one unit (the whole model, or a module holding several blocks of
the ``no_split_module_classes``) is cut into units, each with its own hook, so a forward holds one
unit at a time, never the whole entry. Disk weights already in a safetensors checkpoint are read
from it in place; nothing is copied to the offload folder for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from x_bigmodel.devices.device_keys import (
    OFFLOAD_TARGETS,
    DeviceKey,
    check_devices_exist,
    device_key,
    run_device,
    storage_device,
)
from x_bigmodel.devices.tensor_placement import as_device, assign_tensor, owner_of
from x_bigmodel.dispatch.hook_attach import attach_hooks
from x_bigmodel.dispatch.hooks import remove_hook_from_module
from x_bigmodel.dispatch.tensor_sources import (
    ResidentTensor,
    UnitFinder,
    alias_groups,
    assign_entries,
    materialise,
    meta_like,
    source_for,
)
from x_bigmodel.offload.blocks import OffloadedBlock, WeightGroup
from x_bigmodel.offload.weights import FileWeight, read_offload_index, sources_from_index, write_offload_files
from x_bigmodel.planning.device_plan import DevicePlan

__all__ = ["dispatch_planned"]


def dispatch_planned(
    model: nn.Module,
    plan: DevicePlan,
    *,
    main_device: int | str | torch.device | None = None,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    offload_index: Mapping[str, Mapping[str, Any]] | None = None,
    offload_buffers: bool = False,
    skip_keys: str | Iterable[str] | None = None,
    preload_module_classes: Iterable[str] | None = None,
    force_hooks: bool = False,
    output_device: int | str | torch.device | None = None,
    prefetch: bool = True,
) -> nn.Module:
    """``dispatch_model`` once its map is resolved: ``plan`` (with the offload folder) is read as is.

    See ``x_bigmodel.dispatch.entry_points.dispatch_model`` for the arguments.
    """
    plan.check_present()
    check_devices_exist(_named_keys(main_device=main_device, output_device=output_device))
    remove_hook_from_module(model, recurse=True)
    main = as_device(main_device) if main_device is not None else plan.main_device()
    output = as_device(output_device) if output_device is not None else main
    model.hf_device_map = plan.as_dict()  # type: ignore[assignment]
    devices = plan.devices
    if not force_hooks and len(devices) == 1 and not plan.uses_disk:
        only = devices[0]
        if run_device(only, main) == storage_device(only):
            model.to(storage_device(only))
            return model

    offload_dir = plan.offload_folder
    if skip_keys is None:
        skip_keys = getattr(model, "_skip_keys_device_placement", None) or ()
    skip = (skip_keys,) if isinstance(skip_keys, str) else tuple(skip_keys)
    index = {**(read_offload_index(offload_dir) if offload_dir is not None else {}), **(offload_index or {})}
    unit_classes = set(getattr(model, "_no_split_modules", None) or ()) | set(preload_module_classes or ())

    entries = assign_entries(model, plan)
    units = UnitFinder(model, unit_classes)
    blocks_by_module: dict[str, list[WeightGroup]] = {}
    to_save: dict[str, dict[str, torch.Tensor]] = {}
    resident: list[ResidentTensor] = []
    persistent = set(model.state_dict(keep_vars=True))
    kept_buffers: dict[str, dict[str, torch.Tensor]] = {}
    for alias in alias_groups(model):
        names, tensor = alias.names, alias.tensor
        entry = entries[names[0]]
        device = plan.entries[entry]
        run = run_device(device, main)
        offloaded = device == "disk" or (device == "cpu" and run.type != "cpu")
        unsaved = tensor.device.type != "meta" and device == "disk" and not any(n in index for n in names)
        # Buffers stay on the execution device unless asked; non-persistent ones always (they are
        # in no checkpoint, so there is nothing to read them back from).
        if not offloaded or (alias.is_buffer and (not offload_buffers or names[0] not in persistent)):
            if unsaved and names[0] in persistent:
                kept_buffers.setdefault(entry or "model", {}).update(dict.fromkeys(names, tensor))
            target = run if device in OFFLOAD_TARGETS else storage_device(device)
            resident.append(ResidentTensor(names=names, device=target))
            continue
        if unsaved:
            to_save.setdefault(entry or "model", {}).update(dict.fromkeys(names, tensor))
        # A tensor tied across units (embedding and LM head) is brought in by each unit that uses it.
        by_unit: dict[str, list[str]] = {}
        for name in names:
            by_unit.setdefault(units.unit_for(entries[name], name), []).append(name)
        for unit, unit_names in by_unit.items():
            slots = [owner_of(model, n) for n in unit_names]
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
        {n: index[n] for kept in resident for n in kept.names if n in index}, offload_dir
    )
    for kept in resident:
        materialise(model, kept.names, kept.device, resident_sources, state_dict)
    blocks: list[OffloadedBlock] = []
    for unit, unit_groups in blocks_by_module.items():
        for group in unit_groups:
            group.source = source_for(group, file_sources, state_dict)
            dtype = group.source.dtype if isinstance(group.source, FileWeight) else group.source.tensor.dtype
            group.template = meta_like(group.template, dtype)
            for owner, leaf in group.slots:
                assign_tensor(owner, leaf, group.template)
        device = plan.entries[entries[unit_groups[0].names[0]]]
        blocks.append(OffloadedBlock(unit, unit_groups, run_device(device, main)))

    attach_hooks(model, plan, main, output, blocks, skip, prefetch=prefetch)
    return model


def _named_keys(**devices: int | str | torch.device | None) -> list[tuple[str, DeviceKey]]:
    """The device keys of the arguments given; spellings with no key (``"xpu"``) are left to torch."""
    keys = []
    for name, device in devices.items():
        if device is not None:
            try:
                keys.append((name, device_key(device)))
            except ValueError:
                continue
    return keys
