"""``save``: Accelerate's ``accelerate.utils.save``, ``torch.save`` (or safetensors) on one process only."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import IO, Any

import torch

from x_common.process_env import process_env
from x_runtime.io.files import torch_save
from x_runtime.io.model_files import save_tensors_file
from x_runtime.process.collectives import rank

__all__ = ["save"]

_log = logging.getLogger(__name__)


def save(
    obj: Any,
    f: str | os.PathLike[str] | IO[bytes],
    save_on_each_node: bool = False,
    safe_serialization: bool = False,
) -> None:
    """Write ``obj`` to ``f`` on the main process (the main process of each node with ``save_on_each_node``).

    A path is written atomically (complete or not at all). ``safe_serialization`` writes a dict of
    tensors as a safetensors file: tensors sharing memory (tied weights) are stored once, which is
    logged as a warning naming them; x's loaders restore them from the file's metadata, other
    safetensors readers do not see those names.

    Raises:
        TypeError: ``safe_serialization`` with a file object instead of a path.
    """
    writer = process_env().local_rank == 0 if save_on_each_node else rank() == 0
    if not writer:
        return
    if not safe_serialization:
        if isinstance(f, (str, os.PathLike)):
            torch_save(obj, Path(f))
        else:
            torch.save(obj, f)
        return
    if not isinstance(f, (str, os.PathLike)):
        raise TypeError(f"save(safe_serialization=True) writes to a path, got {type(f).__name__}")
    aliases = save_tensors_file(obj, f)
    if aliases:
        shared = ", ".join(f"{alias} (= {kept})" for alias, kept in aliases.items())
        _log.warning(
            "Removed shared tensor %s while saving %s: stored once under the name it shares memory with; x's "
            "loaders restore it from the file's metadata, other safetensors readers will not see it",
            shared,
            f,
        )
