"""What the loader will read, worked out from the checkpoint's headers before any tensor is loaded.

A ``LoadPlan`` says, for each model tensor the checkpoint holds, which file and key hold it, with
its shape and dtype in the file; and which checkpoint keys the model lacks. ``check_keys`` then
reports missing and unexpected keys, so a bad checkpoint fails before the model changes.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from x_bigmodel.devices.tensor_placement import placement_dtype
from x_bigmodel.files.checkpoint_files import open_checkpoint
from x_bigmodel.planning.device_plan import DevicePlan

__all__ = ["LoadPlan", "PlannedTensor", "alias_groups", "check_keys", "listing", "plan_load", "planned_dtype"]

_MAX_LISTED = 10


@dataclass(frozen=True, kw_only=True)
class PlannedTensor:
    """Where one model tensor is in the checkpoint: ``file``, ``key`` in it, ``shape``, ``file_dtype``, ``nbytes``."""

    file: Path
    key: str
    shape: tuple[int, ...]
    file_dtype: str  # as the file names it, e.g. "float16"
    nbytes: int = 0  # as stored in the file


@dataclass(frozen=True, kw_only=True)
class LoadPlan:
    """Each model tensor found in the checkpoint, in file order, and the checkpoint keys the model lacks."""

    tensors: Mapping[str, PlannedTensor] = field(default_factory=dict)
    unexpected: tuple[str, ...] = ()

    def by_file(self) -> dict[Path, list[str]]:
        """Tensor names grouped by the file holding them, files in the order first met."""
        result: dict[Path, list[str]] = {}
        for name, planned in self.tensors.items():
            result.setdefault(planned.file, []).append(name)
        return result


def plan_load(
    files: Mapping[Path, list[str] | None],
    expected: Mapping[str, torch.Tensor],
    plan: DevicePlan | None,
    names: Mapping[str, str] | None = None,
) -> LoadPlan:
    """Find each model tensor in ``files``, checking shapes and (with ``plan``) that it has a device.

    ``names`` maps checkpoint keys to model names where they differ (a transformers checkpoint saved
    with another prefix or legacy names); other keys are model names as they are.

    Raises:
        ValueError: a shard lacks keys its index promised, a shape differs from the model's, or a
            tensor has no device in ``plan``.
    """
    tensors: dict[str, PlannedTensor] = {}
    unexpected: list[str] = []
    for path, wanted in files.items():
        with open_checkpoint(path) as reader:
            present = reader.keys()
            keys = present if wanted is None else wanted
            missing_in_file = set(keys) - set(present)
            if missing_in_file:
                raise ValueError(
                    f"checkpoint file {str(path)!r} lacks {listing(sorted(missing_in_file))} "
                    "that the index says it holds"
                )
            for key in keys:
                name = names.get(key, key) if names else key
                if name not in expected:
                    unexpected.append(key)
                    continue
                shape = reader.shape(key)
                if shape != tuple(expected[name].shape):
                    raise ValueError(
                        f"shape mismatch for {name}: the checkpoint ({path.name}) has {shape}, "
                        f"the model expects {tuple(expected[name].shape)}"
                    )
                if plan is not None:
                    plan.device_for(name)  # fail before loading if unplaced
                tensors[name] = PlannedTensor(
                    file=path, key=key, shape=shape, file_dtype=reader.dtype(key), nbytes=reader.nbytes(key)
                )
    return LoadPlan(tensors=tensors, unexpected=tuple(unexpected))


def check_keys(
    model: nn.Module,
    expected: Mapping[str, torch.Tensor],
    aliases: Mapping[str, list[str]],
    load_plan: LoadPlan,
    strict: bool,
    allow_missing_keys: bool,
) -> None:
    """Warn about (or, when ``strict``, reject) unexpected keys; reject missing ones unless allowed.

    Raises:
        ValueError: unexpected keys when ``strict``, missing keys without ``allow_missing_keys``.
    """
    name = type(model).__name__
    unexpected = list(load_plan.unexpected)
    if unexpected:
        message = f"the checkpoint has {listing(unexpected)} that {name} does not have"
        if strict:
            raise ValueError(message + " (strict=True)")
        warnings.warn(message + "; they are skipped", stacklevel=4)
    covered = {alias for key in load_plan.tensors for alias in aliases[key]}
    missing = [key for key in expected if key not in covered]
    if missing:
        message = f"{name} has {listing(missing)} that the checkpoint lacks"
        if not allow_missing_keys:
            raise ValueError(message + "; pass allow_missing_keys=True to load the rest")
        warnings.warn(message + "; they keep their current value", stacklevel=4)


def listing(names: list[str]) -> str:
    """``"3 tensors (a, b, c)"``, at most ten names shown."""
    shown = ", ".join(names[:_MAX_LISTED])
    more = f", ... ({len(names) - _MAX_LISTED} more)" if len(names) > _MAX_LISTED else ""
    return f"{len(names)} tensor{'s' if len(names) != 1 else ''} ({shown}{more})"


def alias_groups(state: Mapping[str, torch.Tensor]) -> dict[str, list[str]]:
    """Each name to every name of its tensor (tied weights are one tensor object under several names)."""
    by_id: dict[int, list[str]] = {}
    for name, tensor in state.items():
        by_id.setdefault(id(tensor), []).append(name)
    return {name: by_id[id(tensor)] for name, tensor in state.items()}


def planned_dtype(
    name: str,
    current: torch.Tensor,
    planned: PlannedTensor,
    dtype: torch.dtype | None,
    fp32_modules: list[tuple[str, ...]],
) -> torch.dtype:
    """The dtype a tensor must have once read, worked out from the header alone."""
    file_dtype = getattr(torch, planned.file_dtype, None)
    probe = torch.empty(0, dtype=file_dtype if isinstance(file_dtype, torch.dtype) else current.dtype)
    return placement_dtype(probe, current, dtype, name, fp32_modules)
