"""``torch.save`` files of a checkpoint: written atomically, read back without running pickled code.

The orchestration (``checkpointing``) and the strategies that write optimizer files both use them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from x_runtime.checkpoint.atomic import write_file_atomic

__all__ = ["torch_load", "torch_save"]


def torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` written atomically (a crash never leaves half a file)."""
    write_file_atomic(path, lambda tmp: torch.save(obj, tmp))


def torch_load(path: Path) -> Any:
    """Read a ``torch_save`` file on CPU without running pickled code."""
    return torch.load(path, map_location="cpu", weights_only=True)
