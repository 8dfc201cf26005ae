"""Checkpoints: ``save_state``/``load_state`` folders, model weight files, atomic writes, RNG state.

``checkpointing`` writes and reads a whole checkpoint folder (the strategy writes model and
optimizer files); ``naming`` picks the folder (automatic ``checkpoint_<n>`` naming, pruning);
``model_files`` writes safetensors weights (sharded, ties kept); ``files`` the ``torch.save``
files; ``atomic`` makes every write all-or-nothing; ``disk_space`` checks free space before a
save and turns a full disk into one ``DiskFullError``; ``random_state`` seeds and captures the
generators.
"""

from x_runtime.checkpoint.atomic import replace_dir, write_file_atomic
from x_runtime.checkpoint.checkpointing import (
    MANIFEST,
    CheckpointParts,
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    resolve_checkpoint,
    save_checkpoint,
)
from x_runtime.checkpoint.disk_space import DiskFullError
from x_runtime.checkpoint.files import torch_load, torch_save
from x_runtime.checkpoint.model_files import (
    load_state_dict_files,
    load_tensors_file,
    save_object,
    save_state_dict_files,
    save_tensors_file,
)
from x_runtime.checkpoint.random_state import capture_rng_state, restore_rng_state, set_seed, synchronize_rng_states

__all__ = [
    "MANIFEST",
    "CheckpointParts",
    "DiskFullError",
    "capture_rng_state",
    "latest_checkpoint",
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
]
