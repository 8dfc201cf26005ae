"""Where ``save_state`` writes and ``load_state`` reads: a folder given, or automatic naming.

With ``ProjectConfiguration(automatic_checkpoint_naming=True)`` checkpoints are
``<project_dir>/checkpoints/checkpoint_<iteration>``; the iteration advances after each save,
``total_limit`` prunes the oldest only after the new one is complete, and loading the latest sets
the iteration past it.
"""

from __future__ import annotations

import os
from pathlib import Path

from x_runtime.checkpoint.checkpointing import latest_checkpoint, prune_checkpoints
from x_runtime.core.configs import ProjectConfiguration

__all__ = ["checkpoints_root", "load_source", "note_loaded", "note_saved", "prune_saved", "save_target"]

_PREFIX = "checkpoint_"


def checkpoints_root(config: ProjectConfiguration) -> Path:
    if config.project_dir is None:
        raise ValueError("automatic_checkpoint_naming needs a project_dir (Accelerator(project_dir=...))")
    return Path(config.project_dir) / "checkpoints"


def save_target(config: ProjectConfiguration, output_dir: str | os.PathLike | None) -> Path:
    """The folder the next ``save_state`` writes; an existing automatic one is refused."""
    if config.automatic_checkpoint_naming:
        target = checkpoints_root(config) / f"{_PREFIX}{config.iteration}"
        if target.exists():
            raise FileExistsError(f"{target} exists; set ProjectConfiguration(iteration=...) past it")
        return target
    if output_dir is None:
        raise ValueError("save_state needs output_dir (or ProjectConfiguration(automatic_checkpoint_naming=True))")
    return Path(output_dir)


def note_saved(config: ProjectConfiguration, *, is_main_process: bool) -> None:
    """After a complete save: prune beyond ``total_limit`` (main process) and advance the iteration."""
    prune_saved(config, is_main_process=is_main_process)
    config.iteration += 1


def prune_saved(config: ProjectConfiguration, *, is_main_process: bool) -> None:
    """Remove automatic checkpoints beyond ``total_limit`` (main process; after a save is complete)."""
    if config.automatic_checkpoint_naming and config.total_limit is not None and is_main_process:
        prune_checkpoints(checkpoints_root(config), config.total_limit)


def load_source(config: ProjectConfiguration, input_dir: str | os.PathLike | None) -> Path:
    """The folder ``load_state`` reads: the one given, or the latest automatic checkpoint."""
    if input_dir is not None:
        return Path(input_dir)
    if not config.automatic_checkpoint_naming:
        raise ValueError("load_state needs input_dir (or ProjectConfiguration(automatic_checkpoint_naming=True))")
    return latest_checkpoint(checkpoints_root(config))


def note_loaded(config: ProjectConfiguration, folder: Path) -> None:
    """Continue automatic numbering after the checkpoint just loaded."""
    number = folder.name[len(_PREFIX) :]
    if config.automatic_checkpoint_naming and folder.name.startswith(_PREFIX) and number.isdigit():
        config.iteration = int(number) + 1
