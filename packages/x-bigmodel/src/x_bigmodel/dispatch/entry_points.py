"""Run a model spread over devices: ``dispatch_model``, ``load_checkpoint_and_dispatch``,
``cpu_offload``, ``cpu_offload_with_hook`` and ``disk_offload``, with Accelerate's names and arguments.

``device_map`` is resolved once, here, into a ``DevicePlan`` (``plan_device_map``); the loader
(``load_planned``) and the dispatcher (``dispatch_planned``, which documents the hooks and the
offloading) read that plan as is. ``cpu_offload`` and ``disk_offload`` live in
``x_bigmodel.dispatch.whole_model``, ``cpu_offload_with_hook`` in ``x_bigmodel.dispatch.offload_hook``; all are
re-exported here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from x_bigmodel.devices.tensor_placement import torch_dtype
from x_bigmodel.dispatch.offload_hook import cpu_offload_with_hook
from x_bigmodel.dispatch.planned import dispatch_planned
from x_bigmodel.dispatch.whole_model import cpu_offload, disk_offload
from x_bigmodel.files.checkpoint_files import resolve_checkpoint_files
from x_bigmodel.loading.checkpoint import load_planned
from x_bigmodel.planning.budgets import check_budget_devices
from x_bigmodel.planning.device_map import plan_device_map
from x_bigmodel.planning.device_plan import DeviceMap, DevicePlan

__all__ = ["cpu_offload", "cpu_offload_with_hook", "disk_offload", "dispatch_model", "load_checkpoint_and_dispatch"]


def dispatch_model(
    model: nn.Module,
    device_map: DeviceMap | DevicePlan | str,
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
        device_map: ``{module or tensor name: device}`` (see ``resolve_device_map``), a strategy
            name (planned within the free memory; with ``offload_dir``, disk comes last), or a
            ``DevicePlan`` (taken as already resolved).
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
    return dispatch_planned(
        model,
        plan_device_map(model, device_map, offload_folder=offload_dir),
        main_device=main_device,
        state_dict=state_dict,
        offload_index=offload_index,
        offload_buffers=offload_buffers,
        skip_keys=skip_keys,
        preload_module_classes=preload_module_classes,
        force_hooks=force_hooks,
        output_device=output_device,
        prefetch=prefetch,
    )


def load_checkpoint_and_dispatch(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: DeviceMap | DevicePlan | str | None = None,
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

    With ``offload_folder``, a strategy puts on disk what does not fit in ``max_memory``'s other
    budgets (disk is the last device, with no limit unless ``max_memory`` gives one), as in
    Accelerate; without one, a model that does not fit raises ``ValueError``. Disk-mapped weights
    are read from a safetensors checkpoint in place (the folder holds only the offload
    ``index.json``); from ``.bin`` checkpoints they are saved there as safetensors.
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
    check_budget_devices(max_memory)
    if no_split_module_classes is None:
        no_split_module_classes = getattr(model, "_no_split_modules", None)
    plan = None
    if device_map is not None:
        # Resolved once, before anything is read or written: a bad map changes nothing.
        plan = plan_device_map(
            model,
            device_map,
            max_memory=max_memory,
            no_split_module_classes=no_split_module_classes,
            dtype=dtype,
            offload_buffers=offload_buffers,
            offload_folder=offload_folder,
        )
    index = load_planned(
        model,
        resolve_checkpoint_files(checkpoint),
        plan,
        dtype=torch_dtype(dtype) if dtype is not None else None,
        offload_buffers=offload_buffers,
        strict=strict,
        allow_missing_keys=allow_missing_keys,
        show_progress=show_progress,
        mmap=mmap,
    )
    if plan is None:
        return model
    return dispatch_planned(
        model,
        plan,
        offload_index=index,
        offload_buffers=offload_buffers,
        skip_keys=skip_keys,
        preload_module_classes=[*(preload_module_classes or ()), *(no_split_module_classes or ())],
        force_hooks=force_hooks,
        output_device=output_device,
        prefetch=prefetch,
    )
