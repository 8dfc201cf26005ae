"""Folders written by Accelerate's ``save_state``, read by x's ``load_state``.

Accelerate writes no manifest; its folder is told apart from an interrupted x save by the files
in it (``written_by_accelerate``): Accelerate's ``random_states_<rank>.pkl`` and weights, and
none of what only x writes (``dataloaders.json``, ``random_states_<rank>.bin``). Its layout:

    model.safetensors | pytorch_model.bin, model_1.safetensors | pytorch_model_1.bin, ...
    optimizer.bin, optimizer_1.bin, ...     scheduler.bin, scheduler_1.bin, ...
    scaler.pt                               (fp16)
    sampler.bin, dl_state_dict.bin, ...     (some loaders; not read: x's loaders restart, as
                                             Accelerate's own do for a map-style dataset)
    custom_checkpoint_<i>.pkl               registered objects (torch.save of their state_dict)
    random_states_<rank>.pkl                every rank's generators and the accelerator's step

Every file is read without running pickled code: tensors through torch's safe loader, the RNG
pickles through ``io.accelerate_pickles`` (NumPy arrays admitted, nothing else).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from x_runtime.checkpoint.parts import MANIFEST, CheckpointParts, numbered
from x_runtime.core.random_state import restore_rng_state
from x_runtime.io.accelerate_pickles import load_accelerate_pickle, x_random_states
from x_runtime.io.files import torch_load
from x_runtime.process.topology.distributed_type import SHARDED
from x_runtime.strategies.defaults import check_shapes, load_full_weights

if TYPE_CHECKING:
    from x_runtime.process.topology.state import ProcessState
    from x_runtime.strategies.base import Strategy

__all__ = ["foreign_files", "load_accelerate_checkpoint", "written_by_accelerate"]

logger = logging.getLogger(__name__)

# Only x writes these (every x save writes random_states_<rank>.bin on every rank).
_X_ONLY = ("dataloaders.json", ".x_save_token", "random_states_*.bin", "custom_checkpoint_*.bin")
# Only Accelerate writes these; its weights and optimizer files count when nothing of x's is there.
_ACCELERATE = ("random_states_*.pkl", "custom_checkpoint_*.pkl", "model*.safetensors", "pytorch_model*", "optimizer*")
# Accelerate's sharded layouts, which x does not read: FSDP's folders/files, DeepSpeed's engine folder.
_SHARDED = {"pytorch_model_fsdp_*": "FSDP", "latest": "DeepSpeed"}
_UNREAD_LOADER_FILES = ("sampler*.bin", "dl_state_dict*.bin")


def _any(folder: Path, patterns: tuple[str, ...]) -> bool:
    return any(next(folder.glob(pattern), None) is not None for pattern in patterns)


def written_by_accelerate(folder: Path) -> bool:
    """Whether ``folder`` is a checkpoint Accelerate's ``save_state`` wrote (not an x one).

    Examples:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> written_by_accelerate(folder)
        False
        >>> _ = (folder / "random_states_0.pkl").write_bytes(b"")
        >>> written_by_accelerate(folder)
        True
    """
    if not folder.is_dir() or (folder / MANIFEST).is_file():
        return False
    return not _any(folder, _X_ONLY) and _any(folder, _ACCELERATE)


# Every name Accelerate's save_state writes into its folder (one process or many, any strategy x reads).
_ITS_FILES = (*_ACCELERATE, "scheduler*.bin", "scaler.pt", *_UNREAD_LOADER_FILES)


def foreign_files(folder: Path) -> list[str]:
    """What in Accelerate's checkpoint ``folder`` its ``save_state`` did not write (sorted names).

    A save replaces Accelerate's folder whole, as it replaces its own (Accelerate's save_state
    overwrites in place): only when nothing else would go with it.
    """
    return sorted(p.name for p in folder.iterdir() if not any(p.match(pattern) for pattern in _ITS_FILES))


def load_accelerate_checkpoint(folder: Path, parts: CheckpointParts, state: ProcessState, strict: bool) -> Path:
    """Restore ``parts`` from Accelerate's folder; ``parts.step`` gets the step it recorded."""
    if state.is_main_process:
        logger.warning("%s was written by Accelerate (no %s): reading Accelerate's layout", folder, MANIFEST)
    _refuse_sharded(folder, parts)
    if parts.before_load is not None:
        parts.models = parts.before_load(folder)
    _check_counts(folder, parts)
    for index, model in enumerate(parts.models):
        _load_model(folder, index, model, parts.strategy, strict)
    for index, optimizer in enumerate(parts.optimizers):
        name = numbered("optimizer", index, "")
        _require(folder, f"{name}.bin", f"optimizer {index}")
        parts.strategy.load_optimizer_files(folder, name, optimizer, parts.owner(optimizer), {"layout": "full"})
    for index, scheduler in enumerate(parts.schedulers):
        scheduler.load_state_dict(torch_load(_require(folder, numbered("scheduler", index, ".bin"), "scheduler")))
    if parts.scaler is not None and (folder / "scaler.pt").is_file():
        parts.scaler.load_state_dict(torch_load(folder / "scaler.pt"))
    for index, obj in enumerate(parts.custom):
        obj.load_state_dict(torch_load(_require(folder, f"custom_checkpoint_{index}.pkl", "registered object")))
    unread = sorted(p.name for pattern in _UNREAD_LOADER_FILES for p in folder.glob(pattern))
    if unread and state.is_main_process:
        logger.warning(
            "%s: not read: %s (Accelerate's sampler/loader state); the prepared loaders start from their "
            "beginning: skip_first_batches to resume mid-epoch",
            folder,
            ", ".join(unread),
        )
    _restore_random_states(folder, parts, state)
    return folder


def _refuse_sharded(folder: Path, parts: CheckpointParts) -> None:
    found = next((kind for pattern, kind in _SHARDED.items() if next(folder.glob(pattern), None)), None)
    if found is not None:
        raise ValueError(
            f"{folder} is an Accelerate {found} checkpoint; x reads Accelerate's whole-weights layout (one "
            "process or DDP) only: resume it with Accelerate, or save it again with x"
        )
    kind = parts.strategy.distributed_type
    if kind in SHARDED:
        raise ValueError(
            f"{folder} holds Accelerate's whole-weights layout (one process or DDP), which x loads only without "
            f"{kind}: resume it without {kind}, then save_state"
        )


def _require(folder: Path, name: str, what: str) -> Path:
    path = folder / name
    if not path.is_file():
        raise FileNotFoundError(f"{folder} (written by Accelerate) has no {name}: the {what} it needs is missing")
    return path


def _count(folder: Path, names: tuple[str, ...]) -> int:
    # Accelerate numbers files from 0 without gaps: model.safetensors, model_1.safetensors, ...
    stems = [name.split(".", 1) for name in names]
    count = 0
    while any((folder / numbered(stem, count, f".{suffix}")).is_file() for stem, suffix in stems):
        count += 1
    return count


def _check_counts(folder: Path, parts: CheckpointParts) -> None:
    for kind, have, names in (
        ("models", len(parts.models), ("model.safetensors", "pytorch_model.bin")),
        ("optimizers", len(parts.optimizers), ("optimizer.bin",)),
        ("schedulers", len(parts.schedulers), ("scheduler.bin",)),
    ):
        saved = _count(folder, names)
        if saved > have:  # fewer files than objects: the first missing one is named when read
            raise ValueError(
                f"{folder} (written by Accelerate) holds {saved} {kind} but {have} are prepared; prepare the "
                "same objects in the same order as the run that saved it"
            )
    custom = len(list(folder.glob("custom_checkpoint_*.pkl")))
    if custom > len(parts.custom):
        raise ValueError(
            f"{folder} (written by Accelerate) holds {custom} registered objects but {len(parts.custom)} are "
            "registered; register_for_checkpointing the same objects in the same order"
        )


def _load_model(folder: Path, index: int, model: torch.nn.Module, strategy: Strategy, strict: bool) -> None:
    safe = folder / numbered("model", index, ".safetensors")
    pickled = folder / numbered("pytorch_model", index, ".bin")
    path = safe if safe.is_file() else pickled
    if not path.is_file():
        raise FileNotFoundError(
            f"{folder} (written by Accelerate) has no weights for model {index}: neither {safe.name} nor "
            f"{pickled.name} is there"
        )
    expected = model.state_dict()
    weights = _named_as(load_full_weights(path, device=strategy.load_device(model)), expected)
    check_shapes(path, weights, expected)
    model.load_state_dict(weights, strict=strict)


def _named_as(saved: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``saved`` under the model's own names.

    Accelerate saves the wrapped model's state dict (``module.`` under DDP, ``_orig_mod.`` when
    compiled) and, in safetensors, each tied tensor once: the ties get their partner's tensor back.
    """
    for prefix in ("module.", "_orig_mod."):
        while saved and all(k.startswith(prefix) for k in saved) and not all(k.startswith(prefix) for k in expected):
            saved = {k[len(prefix) :]: v for k, v in saved.items()}
    tied: dict[tuple[Any, ...], list[str]] = {}
    for name, tensor in expected.items():
        if tensor.numel():
            key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
            tied.setdefault(key, []).append(name)
    for names in tied.values():
        present = next((name for name in names if name in saved), None)
        if present is not None:
            saved.update({name: saved[present] for name in names if name not in saved})
    return saved


def _restore_random_states(folder: Path, parts: CheckpointParts, state: ProcessState) -> None:
    path = folder / f"random_states_{state.rank}.pkl"
    if not path.is_file():
        logger.warning(
            "%s has no random state for rank %d (saved with fewer processes?); random draws will differ",
            folder,
            state.rank,
        )
        return
    saved = load_accelerate_pickle(path)
    if "step" in saved:
        parts.step = int(saved["step"])
    restore_rng_state(x_random_states(saved))
