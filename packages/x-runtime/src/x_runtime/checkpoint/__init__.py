"""Checkpoints: ``save_state``/``load_state`` folders.

``checkpointing`` writes and reads a whole checkpoint folder (the strategy writes model and
optimizer files), after ``staging`` has had the ranks claim and prepare its hidden folder;
``background`` writes it in a thread per process for ``save_state(async_save=True)``, from the
copy ``snapshot`` takes; ``accelerate_layout`` reads a folder Accelerate's ``save_state`` wrote;
``parts`` is what both restore; ``naming`` picks the folder (automatic ``checkpoint_<n>`` naming, pruning).
The files themselves are written by ``io`` (atomic writes, free space, torch and safetensors
files) and the generators captured by ``core.random_state``; their names are re-exported here.
"""

from x_runtime.checkpoint.accelerate_layout import load_accelerate_checkpoint, written_by_accelerate
from x_runtime.checkpoint.checkpointing import (
    MANIFEST,
    CheckpointParts,
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    resolve_checkpoint,
    save_checkpoint,
)
from x_runtime.core.random_state import capture_rng_state, restore_rng_state, set_seed, synchronize_rng_states
from x_runtime.io.atomic import replace_dir, write_file_atomic
from x_runtime.io.disk_space import DiskFullError
from x_runtime.io.files import torch_load, torch_save
from x_runtime.io.model_files import (
    load_state_dict_files,
    load_tensors_file,
    save_object,
    save_state_dict_files,
    save_tensors_file,
)

__all__ = [
    "MANIFEST",
    "CheckpointParts",
    "DiskFullError",
    "capture_rng_state",
    "latest_checkpoint",
    "load_accelerate_checkpoint",
    "load_checkpoint",
    "load_state_dict_files",
    "load_tensors_file",
    "prune_checkpoints",
    "replace_dir",
    "resolve_checkpoint",
    "restore_rng_state",
    "save_checkpoint",
    "save_object",
    "save_state_dict_files",
    "save_tensors_file",
    "set_seed",
    "synchronize_rng_states",
    "torch_load",
    "torch_save",
    "write_file_atomic",
    "written_by_accelerate",
]
