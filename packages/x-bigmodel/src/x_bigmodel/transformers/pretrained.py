"""``from_pretrained``: a transformers model from a folder or a Hub id, spread over GPUs, CPU and disk.

transformers' own ``from_pretrained(device_map=...)`` needs Accelerate; this builds the same model
with x-bigmodel's parts: the class's constructor on the meta device (``init_empty_weights``), its
own weight tying and key conversions (``key_mapping``), a device map planned from its
``_no_split_modules`` (``plan_device_map``), the checkpoint streamed by ``load_planned`` (disk
weights read in place: nothing is rewritten) and hooks from ``dispatch_planned``. transformers is
imported only here, when the function runs.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict

import torch
from torch import nn

from x_bigmodel.devices.device_keys import storage_device
from x_bigmodel.devices.tensor_placement import set_module_tensor_to_device, torch_dtype
from x_bigmodel.dispatch.planned import dispatch_planned
from x_bigmodel.files.checkpoint_files import open_checkpoint
from x_bigmodel.loading.checkpoint import load_planned
from x_bigmodel.loading.load_plan import listing
from x_bigmodel.planning.budgets import check_budget_devices
from x_bigmodel.planning.device_map import plan_device_map
from x_bigmodel.planning.device_plan import DeviceMap, DevicePlan
from x_bigmodel.planning.empty_weights import init_empty_weights
from x_bigmodel.transformers.conversions import load_converted
from x_bigmodel.transformers.hub_files import resolve_model_files
from x_bigmodel.transformers.key_mapping import LoadReport, map_checkpoint_keys, report_keys

__all__ = ["from_pretrained"]


class _HubOptions(TypedDict):
    """How a Hub id is resolved, as huggingface_hub's arguments of the same names."""

    revision: str | None
    token: str | bool | None
    cache_dir: str | os.PathLike[str] | None
    local_files_only: bool


def from_pretrained(
    model: str | os.PathLike[str],
    *,
    model_class: Any = None,
    device_map: DeviceMap | DevicePlan | str | None = "auto",
    max_memory: Mapping[Any, int | str] | None = None,
    dtype: str | torch.dtype | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    revision: str | None = None,
    token: str | bool | None = None,
    trust_remote_code: bool = False,
    allow_missing: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    local_files_only: bool = False,
    use_safetensors: bool = True,
    show_progress: bool = True,
    **config_overrides: Any,
) -> nn.Module:
    """Load a transformers model from ``model`` (a folder, or a Hub id) onto GPUs, then CPU, then disk.

    Args:
        model: a folder holding ``config.json`` and ``model.safetensors`` (or a sharded
            ``model.safetensors.index.json``), or a Hub id, resolved through huggingface_hub's
            cache (only the config, index and shards are fetched; ``HF_HUB_OFFLINE=1`` reads the
            cache alone).
        model_class: a transformers model class or an ``AutoModelFor...`` class. Default: the
            class named in ``config.architectures``.
        device_map: ``"auto"``, ``"balanced"``, ``"balanced_low_0"``, ``"sequential"`` (planned
            within ``max_memory``, never cutting one of the class's ``_no_split_modules``), or a
            dict ``{module name: device}``; ``None`` puts everything on the CPU.
        max_memory: budgets per device (``{0: "20GiB", "cpu": "8GiB"}``). Default: what is free.
        dtype: dtype of floating weights. Default: as transformers' ``dtype="auto"``, the
            config's ``dtype``, else the checkpoint's.
        offload_folder: with a strategy, what does not fit goes to disk; weights are read in
            place from the safetensors files (the folder receives an ``index.json``, plus any tensor
            transformers fuses at load time that lands on disk).
        revision, token, cache_dir, local_files_only: as in huggingface_hub, for a Hub id.
        trust_remote_code: allow the config's custom code (``auto_map``), as in transformers.
        allow_missing: load even when model weights are missing from the checkpoint (they are
            initialised the class's way, with a warning); by default that is an error.
        use_safetensors: ``False`` also accepts pickled ``pytorch_model.bin`` weights (read with
            ``torch.load(weights_only=True)``); by default they are refused.
        show_progress: a progress bar of the bytes read, on a terminal, for loads of 1 GiB or more
            (see ``load_checkpoint_in_model``).
        config_overrides: config attributes to set (as ``from_pretrained(..., num_labels=3)``),
            and ``attn_implementation``.

    Returns:
        The model in eval mode with ``hf_device_map`` set, its generation config loaded, ready for
        ``model(**inputs)`` and ``model.generate(...)`` (outputs on the first accelerator in
        the map, else the CPU).

    Raises:
        ValueError: no safetensors weights, missing weights (unless ``allow_missing``), a shape
            mismatch, or a model that does not fit and no ``offload_folder``.
    """
    from transformers import AutoConfig, GenerationConfig
    from transformers.initialization import no_init_weights

    # Devices that are not here fail now, before any file is fetched or weight built.
    check_budget_devices(max_memory)
    if isinstance(device_map, Mapping):
        DevicePlan.from_map(device_map).check_present()

    hub: _HubOptions = {
        "revision": revision,
        "token": token,
        "cache_dir": cache_dir,
        "local_files_only": local_files_only,
    }
    attn_implementation = config_overrides.pop("attn_implementation", None)
    config = AutoConfig.from_pretrained(str(model), trust_remote_code=trust_remote_code, **hub, **config_overrides)
    files = resolve_model_files(model, use_safetensors=use_safetensors, **hub)
    key_files = _key_files(files)
    target_dtype = torch_dtype(dtype) if dtype is not None else _auto_dtype(config, key_files)

    cls = model_class if model_class is not None else _class_of(config, trust_remote_code)
    kwargs: dict[str, Any] = {"dtype": target_dtype}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    # No init: every weight is loaded next (or initialised below when missing), and init ops on
    # meta tensors under init_empty_weights run torch's Python decompositions, costly on first use.
    with init_empty_weights(), no_init_weights():
        if hasattr(cls, "_model_mapping"):  # an AutoModelFor... class picks the concrete one
            net = cls.from_config(config, trust_remote_code=trust_remote_code, **kwargs)
        else:
            net = cls._from_config(config, **kwargs)

    mapping = map_checkpoint_keys(net, key_files)
    report = report_keys(net, mapping)
    _check_report(net, report, allow_missing, str(model))

    no_split = sorted(getattr(net, "_no_split_modules", None) or ())
    if device_map is None:  # transformers' default: everything on the CPU, no hooks
        device_map = {"": "cpu"}
    plan = plan_device_map(
        net,
        device_map,
        max_memory=max_memory,
        no_split_module_classes=no_split,
        dtype=target_dtype,
        offload_folder=offload_folder,
    )
    wanted: dict[Path, list[str]] = {}
    for key in mapping.names:
        wanted.setdefault(key_files[key], []).append(key)
    with warnings.catch_warnings():
        # Missing and unexpected keys were reported above, the way transformers reports them.
        warnings.simplefilter("ignore", UserWarning)
        index = load_planned(
            net,
            wanted,
            plan,
            dtype=None,  # each tensor takes the dtype the class declared (keep-in-fp32 modules too)
            allow_missing_keys=True,
            show_progress=show_progress,
            names=mapping.names,
            # As transformers: CPU weights are the files' pages, faulted in by their first use. Faulting
            # all in here costs more than transformers' whole load and maps embedding rows never read.
            populate=False,
            # But read into the page cache meanwhile, so that a cold first forward does not wait on
            # one page fault after another; disk weights are left to the prefetch thread.
            read_ahead=True,
        )
    index.update(load_converted(net, mapping, key_files, plan, None))
    if report.missing:
        _initialise_missing(net, report.missing, plan)

    net.eval()
    if net.can_generate():
        # Without a generation_config.json the one built from the config stays.
        with contextlib.suppress(OSError):
            # transformers annotates revision as str, but hands it to resolve_revision, which takes None (the default).
            net.generation_config = GenerationConfig.from_pretrained(str(model), **hub)  # type: ignore[arg-type]
    return dispatch_planned(net, plan, offload_index=index, preload_module_classes=no_split)


def _key_files(files: Mapping[Path, list[str] | None]) -> dict[str, Path]:
    """Each checkpoint key to the file holding it (from the index, or the file's header)."""
    result: dict[str, Path] = {}
    for path, keys in files.items():
        if keys is None:
            with open_checkpoint(path) as reader:
                keys = reader.keys()
        for key in keys:
            result[key] = path
    return result


def _auto_dtype(config: Any, key_files: Mapping[str, Path]) -> torch.dtype:
    """transformers' ``dtype="auto"``: the config's dtype, else the first floating one in the checkpoint."""
    declared = getattr(config, "dtype", None)
    if declared is not None:
        return torch_dtype(declared) if isinstance(declared, str) else declared
    for path in dict.fromkeys(key_files.values()):
        with open_checkpoint(path) as reader:
            keys = reader.keys()
            for key in keys:
                found = reader.torch_dtype(key)
                if found.is_floating_point:
                    return found
    return torch.float32


def _class_of(config: Any, trust_remote_code: bool) -> Any:
    import transformers

    architectures = getattr(config, "architectures", None) or []
    for name in architectures:
        if hasattr(transformers, name):
            return getattr(transformers, name)
    auto_map = getattr(config, "auto_map", None) or {}
    if trust_remote_code and architectures:
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        for reference in auto_map.values():
            if str(reference).rsplit(".", 1)[-1] == architectures[0]:
                return get_class_from_dynamic_module(reference, config._name_or_path)
    raise ValueError(
        f"config.architectures is {architectures or 'empty'}, naming no class transformers has"
        + ("; custom code needs trust_remote_code=True" if auto_map else "")
        + ": pass model_class= (a model class or an AutoModelFor... class)"
    )


def _check_report(net: nn.Module, report: LoadReport, allow_missing: bool, where: str) -> None:
    name = type(net).__name__
    if report.unexpected:
        warnings.warn(
            f"Some weights of the checkpoint at {where} were not used when initializing {name}: "
            f"{listing(sorted(report.unexpected))}",
            stacklevel=3,
        )
    if not report.missing:
        return
    message = f"{name} has {listing(sorted(report.missing))} that the checkpoint at {where} lacks"
    if not allow_missing:
        raise ValueError(message + "; pass allow_missing=True to initialise them and load the rest")
    warnings.warn(message + "; they are newly initialised", stacklevel=3)


def _initialise_missing(net: nn.Module, missing: set[str], plan: DevicePlan) -> None:
    """Give missing weights memory on their device (disk ones: the CPU) and the class's initialisation.

    Every other tensor is flagged as initialised, so transformers' guarded init functions touch
    only the missing ones, also in modules whose other weights were loaded.
    """
    missing_ids = set()
    for name in sorted(missing):
        current = net.get_parameter_or_buffer(name)  # type: ignore[operator]
        device = storage_device(plan.device_for(name))
        set_module_tensor_to_device(net, name, device, value=torch.empty_like(current, device="cpu"))
        missing_ids.add(id(net.get_parameter_or_buffer(name)))  # type: ignore[operator]
    for tensor in net.state_dict(keep_vars=True).values():
        if id(tensor) not in missing_ids:
            tensor._is_hf_initialized = True
    owners = {name.rsplit(".", 1)[0] if "." in name else "" for name in missing}
    for owner in sorted(owners):
        net._init_weights(net.get_submodule(owner))  # type: ignore[operator]
