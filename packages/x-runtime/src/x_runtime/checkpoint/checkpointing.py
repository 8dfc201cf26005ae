"""``save_state`` / ``load_state``: everything a run needs to continue exactly where it stopped.

Layout of a checkpoint folder (the names tell what each file holds):

    model.safetensors, model_1.safetensors, ...     weights (shared tensors once); sharded
                                                    strategies may write model_sharded/ instead;
                                                    pytorch_model.bin, ... with safe_serialization=False
    optimizer.bin, optimizer_1.bin, ...             optimizer state dicts
    scheduler.bin, ...                              scheduler state dicts
    scaler.bin                                      fp16 grad scaler
    dataloaders.json                                each prepared loader's epoch, seed, position
    custom_checkpoint_0.bin, ...                    objects from register_for_checkpointing
    random_states_<rank>.bin                        every rank's generators
    x_checkpoint.json                               written last: what the folder holds

``.bin`` files are ``torch.save`` output read back with ``weights_only=True``: loading a
checkpoint never runs pickled code. The folder is assembled under a hidden name, flushed, and
renamed into place by the main process, so a crash mid-save leaves the previous checkpoint whole.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from x_runtime.core.random_state import capture_rng_state, restore_rng_state
from x_runtime.io.atomic import partial_dir_for, replace_dir, write_file_atomic
from x_runtime.io.disk_space import (
    DiskFullError,
    disk_full_while_saving,
    measure_room,
    out_of_space_errno,
    refuse_if_short,
    tensor_bytes,
)
from x_runtime.io.files import torch_load, torch_save
from x_runtime.process.collectives import gather_object

if TYPE_CHECKING:
    from x_runtime.process.state import ProcessState
    from x_runtime.strategies.base import Strategy

__all__ = [
    "MANIFEST",
    "CheckpointParts",
    "automatic_checkpoints",
    "latest_checkpoint",
    "load_checkpoint",
    "prune_checkpoints",
    "resolve_checkpoint",
    "save_checkpoint",
]

logger = logging.getLogger(__name__)

MANIFEST = "x_checkpoint.json"
FORMAT_VERSION = 1
_AUTOMATIC = re.compile(r"checkpoint_(\d+)")


@dataclass
class CheckpointParts:
    """The objects one accelerator saves and restores, in ``prepare`` order per kind."""

    models: list[torch.nn.Module] = field(default_factory=list)  # unwrapped
    optimizers: list[Any] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    dataloaders: list[Any] = field(default_factory=list)
    custom: list[Any] = field(default_factory=list)
    scaler: torch.amp.GradScaler | None = None
    # Writes and reads the model and optimizer files; required (keyword-only, after the defaulted lists).
    strategy: Strategy = field(kw_only=True)
    # Given the folder being written (read), before any file: the models whose files to write (read).
    before_save: Callable[[Path], list[torch.nn.Module]] | None = field(default=None, kw_only=True)
    before_load: Callable[[Path], list[torch.nn.Module]] | None = field(default=None, kw_only=True)

    def owner(self, optimizer: Any) -> torch.nn.Module | None:
        """The model whose parameters ``optimizer`` updates (sharded strategies need the pair)."""
        params = {id(p) for group in optimizer.param_groups for p in group["params"]}
        return next((m for m in self.models if any(id(p) in params for p in m.parameters())), None)


def _name(stem: str, index: int, suffix: str) -> str:
    return f"{stem}{suffix}" if index == 0 else f"{stem}_{index}{suffix}"


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
    target = Path(target)
    partial = partial_dir_for(target)
    needed = 0
    owner = False

    def agree(step: Callable[[], Any]) -> list[Any]:
        def run() -> Any:
            try:
                return step()
            except Exception as error:
                if out_of_space_errno(error, partial) is None:
                    raise
                # One line for the user; the writer's own error stays reachable as __context__.
                raise disk_full_while_saving(error, target=target, partial=partial, needed=needed) from None

        return _agree(state, "save_state", run)

    def claim(claimed: bool) -> None:
        nonlocal owner
        owner = claimed

    try:
        _claim(target, partial, state, agree, claim)
        mine = (lambda: tensor_bytes(parts.models, parts.optimizers)) if owner else (lambda: 0)
        rooms = agree(lambda: measure_room(state.rank, target, partial, mine()))
        refuse_if_short(rooms, state.rank)  # the same rooms everywhere: every rank decides alike
        needed = sum(r.needed for r in rooms if r.filesystem == rooms[state.rank].filesystem)
        layouts: dict[str, Any] = {}
        agree(lambda: _write_files(partial, parts, state, owner, layouts, safe_serialization))
        agree(lambda: _finish(target, partial, parts, state, owner, layouts))
    except Exception:
        if owner:  # every rank is past the failing collective: nobody writes here any more
            shutil.rmtree(partial, ignore_errors=True)
        raise
    return target


def _claim(
    target: Path,
    partial: Path,
    state: ProcessState,
    agree: Callable[[Callable[[], Any]], list[Any]],
    claim: Callable[[bool], None],
) -> None:
    """Decide which rank assembles each folder (``claim(True)`` there) and prepare it."""
    token = uuid.uuid4().hex
    # Round 1: the main process prepares its folder; everyone learns rank 0's token.
    claim(state.is_main_process)
    tokens = agree(lambda: _prepare(target, partial, token) if state.is_main_process else None)
    token = tokens[0]
    if not state.is_main_process:  # a folder rank 0 did not prepare is this rank's own (or its node's)
        seen = _token_in(partial)
        claims = agree(lambda: None if seen == token else f"{socket.gethostname()}:{target.resolve()}")
        mine = claims[state.rank]
        owner = mine is not None and claims.index(mine) == state.rank
        claim(owner)
        agree(lambda: _prepare(target, partial, token) if owner else None)
    elif state.world_size > 1:
        agree(lambda: None)
        agree(lambda: None)


def _write_files(
    partial: Path, parts: CheckpointParts, state: ProcessState, owner: bool, layouts: dict, safe: bool
) -> None:
    if parts.before_save is not None:
        parts.models = parts.before_save(partial)
    io = parts.strategy
    layouts["models"] = [
        io.save_model_files(partial, _name("model", i, ""), m, writer=owner, safe_serialization=safe)
        for i, m in enumerate(parts.models)
    ]
    layouts["optimizers"] = [
        io.save_optimizer_files(partial, _name("optimizer", i, ""), o, parts.owner(o), writer=owner)
        for i, o in enumerate(parts.optimizers)
    ]
    if owner:
        for index, scheduler in enumerate(parts.schedulers):
            torch_save(scheduler.state_dict(), partial / _name("scheduler", index, ".bin"))
        if parts.scaler is not None:
            torch_save(parts.scaler.state_dict(), partial / "scaler.bin")
        for index, obj in enumerate(parts.custom):
            torch_save(io.to_host(obj.state_dict()), partial / f"custom_checkpoint_{index}.bin")
        loaders = [loader.state_dict() for loader in parts.dataloaders]
        write_file_atomic(partial / "dataloaders.json", lambda tmp: tmp.write_text(json.dumps(loaders, indent=1)))
    torch_save(capture_rng_state(), partial / f"random_states_{state.rank}.bin")


def _finish(
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
    (partial / _TOKEN).unlink(missing_ok=True)
    write_file_atomic(partial / MANIFEST, lambda tmp: tmp.write_text(json.dumps(manifest, indent=1) + "\n"))
    replace_dir(partial, target)


_TOKEN = ".x_save_token"


def _prepare(target: Path, partial: Path, token: str) -> str:
    _check_replaceable(target)
    if partial.exists():
        shutil.rmtree(partial)  # left by a save that crashed; never a complete checkpoint
    partial.mkdir(parents=True)
    (partial / _TOKEN).write_text(token)
    return token


def _token_in(partial: Path) -> str | None:
    try:
        return (partial / _TOKEN).read_text()
    except OSError:
        return None


def _agree(state: ProcessState, op: str, step: Callable[[], Any]) -> list[Any]:
    """Run ``step`` here, then learn every rank's outcome (one ``gather_object``, also a barrier).

    Returns every rank's result; raises on every rank when ``step`` raised on any, naming the
    ranks and their errors (this rank's own exception is chained): ``DiskFullError`` when every
    failure was a full disk, else ``RuntimeError``.
    """
    failure: BaseException | None = None
    try:
        outcome: Any = ("ok", step(), False)
    except Exception as error:  # reported to every rank below
        failure = error
        outcome = ("error", f"{type(error).__name__}: {error}", isinstance(error, DiskFullError))
    outcomes = gather_object([outcome]) if state.world_size > 1 else [outcome]
    failed = [(r, text, full) for r, (kind, text, full) in enumerate(outcomes) if kind == "error"]
    if failed:
        if state.world_size == 1 and failure is not None:
            raise failure
        if len(failed) == 1:
            message = f"{op} failed on rank {failed[0][0]}: {failed[0][1]}"
        else:
            details = "; ".join(f"rank {r}: {text}" for r, text, _full in failed)
            message = f"{op} failed on ranks {', '.join(str(r) for r, _text, _full in failed)}: {details}"
        if all(full for _r, _text, full in failed):  # still an OSError(ENOSPC) on every rank
            raise DiskFullError(message, **_amounts_of(failure)) from failure
        raise RuntimeError(message) from failure
    return [value for _kind, value, _full in outcomes]


def _amounts_of(failure: BaseException | None) -> dict[str, Any]:
    if isinstance(failure, DiskFullError):
        return {"path": failure.path, "needed": failure.needed, "free": failure.free, "code": failure.errno}
    return {}


def _check_replaceable(target: Path) -> None:
    # A save replaces only a checkpoint (or an empty folder): never a user's file or folder.
    if target.exists() and not target.is_dir():
        raise ValueError(f"cannot save a checkpoint to {target}: it is a file; save_state writes a folder")
    if target.is_dir() and not (target / MANIFEST).is_file() and any(target.iterdir()):
        raise ValueError(
            f"cannot save a checkpoint to {target}: the folder holds files and is not a checkpoint "
            f"(no {MANIFEST}); choose another folder, or empty it"
        )


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
        raise FileNotFoundError(f"{source} is not a complete checkpoint (no {MANIFEST}); was its save interrupted?")
    raise FileNotFoundError(f"no checkpoint at {source}")


def load_checkpoint(source: Path, parts: CheckpointParts, state: ProcessState, *, strict: bool = True) -> Path:
    """Restore ``parts`` from a folder written by ``save_checkpoint``; return the folder read.

    Every rank calls it (each may pass its own folder); when loading fails on any rank, every
    rank raises, naming it.
    """
    return _agree(state, "load_state", lambda: _load(source, parts, state, strict))[state.rank]


def _load(source: Path, parts: CheckpointParts, state: ProcessState, strict: bool) -> Path:
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
        io.load_model_files(folder, _name("model", index, ""), model, record, strict)
    for index, optimizer in enumerate(parts.optimizers):
        record = _record(layouts, "optimizers", index)
        io.load_optimizer_files(folder, _name("optimizer", index, ""), optimizer, parts.owner(optimizer), record)
    for index, scheduler in enumerate(parts.schedulers):
        scheduler.load_state_dict(torch_load(folder / _name("scheduler", index, ".bin")))
    if parts.scaler is not None and (folder / "scaler.bin").is_file():
        parts.scaler.load_state_dict(torch_load(folder / "scaler.bin"))
    for index, obj in enumerate(parts.custom):
        obj.load_state_dict(torch_load(folder / f"custom_checkpoint_{index}.bin"))
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


def _record(layouts: Mapping[str, Any], kind: str, index: int) -> dict[str, Any]:
    # Checkpoints written before strategies existed hold full weights and record nothing.
    records = layouts.get(kind) or []
    return dict(records[index]) if index < len(records) else {"layout": "full"}


def automatic_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete ``checkpoint_<n>`` folders under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _AUTOMATIC.fullmatch(path.name)
        if match and (path / MANIFEST).is_file():
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
