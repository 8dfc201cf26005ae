"""``save_state`` / ``load_state``: everything a run needs to continue exactly where it stopped.

Layout of a checkpoint folder (the names tell what each file holds):

    model.safetensors, model_1.safetensors, ...     weights (shared tensors once); sharded
                                                    strategies may write model_sharded/ instead;
                                                    pytorch_model.bin, ... with safe_serialization=False
    optimizer.bin, optimizer_1.bin, ...             optimizer state dicts
    scheduler.bin, ...                              scheduler state dicts
    scaler.pt                                       fp16 grad scaler
    dataloaders.json                                each prepared loader's epoch, seed, position
    custom_checkpoint_0.pkl, ...                    objects from register_for_checkpointing
    random_states_<rank>.bin                        every rank's generators
    random_states_<rank>.pkl                        the same, and the accelerator's step, for Accelerate
    x_checkpoint.json                               written last: what the folder holds

The files are ``torch.save`` output read back with ``weights_only=True``: loading a checkpoint
never runs pickled code. What Accelerate's ``load_state`` reads is there under its names and in
its format, so a run x saved resumes under Accelerate as under x: going back loses nothing. The
``.pkl`` random states are for Accelerate only; x reads its ``.bin`` (no NumPy array to admit).
Folders x wrote before it took Accelerate's names hold ``scaler.bin`` and
``custom_checkpoint_<i>.bin``: both still load. A folder Accelerate's ``save_state`` wrote (no
manifest) is read by ``accelerate_layout``. The folder is assembled under a hidden name, flushed, and
renamed into place by the main process, so a crash mid-save leaves the previous checkpoint whole.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from x_runtime.checkpoint.accelerate_layout import load_accelerate_checkpoint, written_by_accelerate
from x_runtime.checkpoint.parts import MANIFEST, CheckpointParts, numbered
from x_runtime.checkpoint.staging import TOKEN, agree, open_staging
from x_runtime.core.one_line_errors import CheckpointNotFoundError
from x_runtime.core.random_state import capture_rng_state, restore_rng_state
from x_runtime.io.accelerate_pickles import accelerate_random_states
from x_runtime.io.atomic import replace_dir, write_file_atomic
from x_runtime.io.files import torch_load, torch_save

if TYPE_CHECKING:
    from x_runtime.process.topology.state import ProcessState

__all__ = [
    "MANIFEST",
    "CheckpointParts",
    "automatic_checkpoints",
    "finish_folder",
    "latest_checkpoint",
    "load_checkpoint",
    "prune_checkpoints",
    "resolve_checkpoint",
    "save_checkpoint",
    "write_files",
]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
SCALER = "scaler.pt"  # Accelerate's name
_AUTOMATIC = re.compile(r"checkpoint_(\d+)")


def save_checkpoint(
    target: Path, parts: CheckpointParts, state: ProcessState, *, safe_serialization: bool = True
) -> Path:
    """Write a complete checkpoint to ``target`` (every rank calls this, each with its own ``target``).

    The ranks may share one folder or each be given its own (per-rank paths, node-local disks):
    the lowest rank that sees a folder assembles and renames it; every rank writes its own files
    into the folder it was given. A failure on any rank makes every rank raise within one
    collective, naming the failing rank, instead of leaving the others in a barrier; the partial
    folder is removed and the previous checkpoint stays. Before writing, each filesystem's free
    space is compared with the weights and optimizer state headed for it: a save that cannot fit
    is refused on every rank, and a disk that fills anyway raises ``DiskFullError`` (folder, bytes
    needed, bytes free) instead of the writer's own error.
    """
    staging = open_staging(target, parts, state)
    try:
        layouts: dict[str, Any] = {}
        staging.agree(lambda: write_files(staging.partial, parts, state, staging.owner, layouts, safe_serialization))
        staging.agree(lambda: finish_folder(staging.target, staging.partial, parts, state, staging.owner, layouts))
    except Exception:
        staging.discard()  # every rank is past the failing collective: nobody writes here any more
        raise
    return staging.target


def write_files(
    partial: Path, parts: CheckpointParts, state: ProcessState, owner: bool, layouts: dict, safe: bool
) -> None:
    if parts.before_save is not None:
        parts.models = parts.before_save(partial)
    io = parts.strategy
    layouts["models"] = [
        io.save_model_files(partial, numbered("model", i, ""), m, writer=owner, safe_serialization=safe)
        for i, m in enumerate(parts.models)
    ]
    layouts["optimizers"] = [
        io.save_optimizer_files(partial, numbered("optimizer", i, ""), o, parts.owner(o), writer=owner)
        for i, o in enumerate(parts.optimizers)
    ]
    if owner:
        for index, scheduler in enumerate(parts.schedulers):
            torch_save(scheduler.state_dict(), partial / numbered("scheduler", index, ".bin"))
        if parts.scaler is not None:
            torch_save(parts.scaler.state_dict(), partial / SCALER)
        for index, obj in enumerate(parts.custom):
            torch_save(io.to_host(obj.state_dict()), partial / f"custom_checkpoint_{index}.pkl")
        loaders = [loader.state_dict() for loader in parts.dataloaders]
        write_file_atomic(partial / "dataloaders.json", lambda tmp: tmp.write_text(json.dumps(loaders, indent=1)))
    rng = parts.random_state if parts.random_state is not None else capture_rng_state()
    torch_save(rng, partial / f"random_states_{state.rank}.bin")
    torch_save(accelerate_random_states(rng, parts.step or 0), partial / f"random_states_{state.rank}.pkl")


def finish_folder(
    target: Path, partial: Path, parts: CheckpointParts, state: ProcessState, owner: bool, layouts: dict
) -> None:
    if not owner:
        return
    manifest = {
        "format_version": FORMAT_VERSION,
        "world_size": state.world_size,
        "models": len(parts.models),
        "optimizers": len(parts.optimizers),
        "schedulers": len(parts.schedulers),
        "dataloaders": len(parts.dataloaders),
        "custom_objects": len(parts.custom),
        "scaler": parts.scaler is not None,
        "layouts": layouts,
    }
    (partial / TOKEN).unlink(missing_ok=True)
    write_file_atomic(partial / MANIFEST, lambda tmp: tmp.write_text(json.dumps(manifest, indent=1) + "\n"))
    replace_dir(partial, target)


def resolve_checkpoint(source: Path) -> Path:
    """The folder to load: ``source``, or the complete copy a crash during replacement left aside."""
    source = Path(source)
    if (source / MANIFEST).is_file():
        return source
    aside = source.with_name(f".{source.name}.old")
    if not source.exists() and (aside / MANIFEST).is_file():
        logger.warning("%s is missing; loading %s, kept aside by an interrupted save", source, aside)
        return aside
    if source.is_dir():
        raise CheckpointNotFoundError(
            f"{source} is not a complete checkpoint (no {MANIFEST}); was its save interrupted?"
        )
    raise CheckpointNotFoundError(f"no checkpoint at {source}{_nearby(source)}")


def _nearby(source: Path) -> str:
    """What the folder above ``source`` holds, so a mistyped name shows the right one."""
    parent = source.parent
    if not parent.is_dir():
        return f" ({parent} does not exist either; pass the folder save_state wrote)"
    found = sorted(p.name for p in parent.iterdir() if (p / MANIFEST).is_file() or written_by_accelerate(p))
    if not found:
        return f" ({parent} holds no checkpoint; pass the folder save_state wrote)"
    shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    return f" ({parent} holds {shown})"


def load_checkpoint(source: Path, parts: CheckpointParts, state: ProcessState, *, strict: bool = True) -> Path:
    """Restore ``parts`` from a folder written by ``save_checkpoint``; return the folder read.

    Every rank calls it (each may pass its own folder); when loading fails on any rank, every
    rank raises, naming it.
    """
    return agree(state, "load_state", lambda: _load(source, parts, state, strict))[state.rank]


def _load(source: Path, parts: CheckpointParts, state: ProcessState, strict: bool) -> Path:
    if written_by_accelerate(Path(source)):  # Accelerate's files, no manifest: read its layout
        return load_accelerate_checkpoint(Path(source), parts, state, strict)
    folder = resolve_checkpoint(source)
    if parts.before_load is not None:
        parts.models = parts.before_load(folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    for kind, have in (
        ("models", len(parts.models)),
        ("optimizers", len(parts.optimizers)),
        ("schedulers", len(parts.schedulers)),
        ("dataloaders", len(parts.dataloaders)),
        ("custom_objects", len(parts.custom)),
    ):
        if manifest[kind] != have:
            raise ValueError(
                f"{folder} holds {manifest[kind]} {kind} but {have} are prepared/registered; "
                "prepare the same objects in the same order as the run that saved it"
            )
    io = parts.strategy
    layouts = manifest.get("layouts", {})
    for index, model in enumerate(parts.models):
        record = _record(layouts, "models", index)
        io.load_model_files(folder, numbered("model", index, ""), model, record, strict)
    for index, optimizer in enumerate(parts.optimizers):
        record = _record(layouts, "optimizers", index)
        io.load_optimizer_files(folder, numbered("optimizer", index, ""), optimizer, parts.owner(optimizer), record)
    for index, scheduler in enumerate(parts.schedulers):
        scheduler.load_state_dict(torch_load(folder / numbered("scheduler", index, ".bin")))
    scaler = _either(folder, SCALER, "scaler.bin")
    if parts.scaler is not None and scaler.is_file():
        parts.scaler.load_state_dict(torch_load(scaler))
    for index, obj in enumerate(parts.custom):
        obj.load_state_dict(
            torch_load(_either(folder, f"custom_checkpoint_{index}.pkl", f"custom_checkpoint_{index}.bin"))
        )
    loaders = json.loads((folder / "dataloaders.json").read_text())
    for loader, loader_state in zip(parts.dataloaders, loaders, strict=True):
        loader.load_state_dict(loader_state)
    rng = folder / f"random_states_{state.rank}.bin"
    if rng.is_file():
        restore_rng_state(torch_load(rng))
    else:
        logger.warning(
            "%s has no random state for rank %d (saved with %d processes); random draws will differ",
            folder,
            state.rank,
            manifest["world_size"],
        )
    return folder


def _either(folder: Path, name: str, earlier: str) -> Path:
    """``folder / name``, or the name x wrote before it took Accelerate's (when only that is there)."""
    path = folder / name
    return folder / earlier if not path.exists() and (folder / earlier).exists() else path


def _record(layouts: Mapping[str, Any], kind: str, index: int) -> dict[str, Any]:
    # Checkpoints written before strategies existed hold full weights and record nothing.
    records = layouts.get(kind) or []
    return dict(records[index]) if index < len(records) else {"layout": "full"}


def automatic_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete ``checkpoint_<n>`` folders under ``root``, oldest first (Accelerate's count too)."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _AUTOMATIC.fullmatch(path.name)
        if match and ((path / MANIFEST).is_file() or written_by_accelerate(path)):
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(root: Path) -> Path:
    found = automatic_checkpoints(root)
    if not found:
        raise FileNotFoundError(f"no complete checkpoint_<n> folder under {root}")
    return found[-1][1]


def prune_checkpoints(root: Path, total_limit: int) -> list[Path]:
    """Remove the oldest automatic checkpoints beyond ``total_limit``; return what was removed."""
    found = automatic_checkpoints(root)
    removed = []
    for _number, path in found[: max(0, len(found) - total_limit)]:
        shutil.rmtree(path)
        removed.append(path)
    return removed
