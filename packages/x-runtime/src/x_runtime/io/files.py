"""``torch.save`` files of a checkpoint: written atomically, read back without running pickled code.

The orchestration (``checkpointing``) and the strategies that write optimizer files both use them.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import torch

from x_runtime.io.atomic import write_file_atomic

__all__ = ["torch_load", "torch_save"]

_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S+)")


def torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` written atomically (a crash never leaves half a file)."""

    def write(tmp: Path) -> None:
        # Through a Python file: a full disk then raises OSError(ENOSPC), where torch's own file
        # writer loses errno and says "unexpected pos".
        with open(tmp, "wb") as handle:
            torch.save(obj, handle)

    write_file_atomic(path, write)


def torch_load(path: Path) -> Any:
    """Read a ``torch_save`` file on CPU without running pickled code.

    A file that needs more than tensors, numbers, strings and containers is refused with an
    ``UnpicklingError`` naming the file and the type it holds; a damaged one with a
    ``RuntimeError`` naming the file.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        # torch's own text advises weights_only=False, which would run the file's code.
        raise pickle.UnpicklingError(_refusal(path, error)) from None
    except RuntimeError as error:
        if "PytorchStreamReader" not in str(error):
            raise
        raise RuntimeError(
            f"cannot read {path}: {str(error).split('.', 1)[0]}; the file is corrupt or truncated "
            "(an interrupted copy?): load an earlier checkpoint or copy it again"
        ) from None


def _refusal(path: Path, error: pickle.UnpicklingError) -> str:
    text = str(error)
    found = _GLOBAL.search(text)
    if found:
        name = found.group(1)
        what, allow = (
            f"a pickled {name}",
            f"; if you trust the file, allow it with torch.serialization.add_safe_globals([{name}])",
        )
    else:
        detail = text.split("WeightsUnpickler error:", 1)[-1].strip().splitlines()
        what, allow = f"pickled data torch's safe loader refuses ({detail[0] if detail else 'no detail'})", ""
    return (
        f"cannot load {path}: it holds {what}, and checkpoints are read with torch.load(weights_only=True), which "
        "never runs pickled code; make the object's state_dict() return tensors, numbers, strings, lists and dicts"
        f"{allow}"
    )
